//! The report tools' symbol cache: any bytes as a cached symbol table (`dcpisym1...`) decode
//! to a table or `None`, never a panic, and an accepted table re-encodes to the same bytes.
//! Any other bytes are taken as an ELF file: building its table never panics, and the table
//! round-trips through the cache encoding.
#![no_main]

use dcpi_client::prof::symbolize::SymbolTable;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.starts_with(b"dcpisym1") {
        if let Some(t) = SymbolTable::decode(data) {
            assert_eq!(t.encode(), data, "accepted a non-canonical encoding");
        }
        return;
    }
    if let Ok(t) = SymbolTable::build(data, None) {
        let enc = t.encode();
        assert_eq!(SymbolTable::decode(&enc).as_ref(), Some(&t), "cache round trip");
    }
});
