use std::path::Path;

use crate::error::Result;

/// One kernel symbol. `addr` is absolute, as /proc/kallsyms showed it when the snapshot was taken.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct KernelSymbol {
    pub addr: u64,
    /// kallsyms type letter (`t`, `T`, `w`, ...).
    pub kind: u8,
    pub name: String,
    /// Index into [`KallsymsSnapshot::modules`], or `None` for the core kernel.
    pub module: Option<u32>,
}

/// A loaded module, from /proc/modules and /sys/module/NAME/notes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct KernelModule {
    pub name: String,
    pub base: u64,
    pub size: u64,
    pub build_id: Option<Vec<u8>>,
}

/// `kallsyms.snap` in each host directory: enough to symbolize kernel samples on another
/// machine. Only text symbols are kept. Binary, checksummed like profiles (FORMAT.md).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct KallsymsSnapshot {
    pub kernel_release: String,
    pub kernel_build_id: Option<Vec<u8>>,
    /// Address of `_text`; kernel profile offsets are relative to it.
    pub text_base: u64,
    pub modules: Vec<KernelModule>,
    /// Sorted by address.
    pub symbols: Vec<KernelSymbol>,
}

impl KallsymsSnapshot {
    /// Build from the text of /proc/kallsyms and /proc/modules (plus build-ids already read).
    pub fn from_proc_text(
        kallsyms: &str,
        modules: &str,
        kernel_release: String,
        kernel_build_id: Option<Vec<u8>>,
        module_build_ids: &dyn Fn(&str) -> Option<Vec<u8>>,
    ) -> Result<KallsymsSnapshot> {
        let _ = (kallsyms, modules, kernel_release, kernel_build_id, module_build_ids);
        todo!()
    }
    pub fn encode(&self) -> Vec<u8> {
        todo!()
    }
    pub fn decode(bytes: &[u8], path: &Path) -> Result<KallsymsSnapshot> {
        todo!("{bytes:?} {path:?}")
    }
    pub fn read(path: &Path) -> Result<KallsymsSnapshot> {
        todo!("{path:?}")
    }
    pub fn write(&self, path: &Path) -> Result<()> {
        todo!("{path:?}")
    }
    /// The symbol containing `addr` (greatest symbol address <= addr, same module).
    pub fn lookup(&self, addr: u64) -> Option<&KernelSymbol> {
        todo!("{addr}")
    }
}
