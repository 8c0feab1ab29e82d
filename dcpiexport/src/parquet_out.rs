//! The two tables as Parquet files (zstd, one row group), with the low-level column writer:
//! no Arrow needed for flat rows.

use std::sync::Arc;

use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::errors::ParquetError;
use parquet::errors::Result;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::{SerializedColumnWriter, SerializedFileWriter};
use parquet::schema::parser::parse_message_type;

/// A row of the `samples` table (EXPORT.md).
#[derive(Clone, Debug, PartialEq)]
pub struct SampleRow {
    pub image: String,
    /// Empty for `[unknown]`.
    pub image_id: String,
    pub build_id: Option<String>,
    pub kind: &'static str,
    pub event: String,
    pub offset: u64,
    pub samples: u64,
    pub weight: f64,
    /// Start of the time slice (Unix seconds) these samples were taken in, from the host-epoch's
    /// `slices.log`; `None`: no slice holds them (a database without slices, or samples the
    /// slice log does not have, EXPORT.md).
    pub slice_start: Option<u64>,
    /// Length of that slice in seconds.
    pub slice_seconds: Option<u64>,
    /// The command whose samples these are (`dcpiexport --command`, from the per-command
    /// profiles); `None`: every command's (the flat profiles).
    pub command: Option<String>,
}

/// A row of the `symbols` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolRow {
    pub image_id: String,
    pub build_id: Option<String>,
    pub image: String,
    pub start: u64,
    pub end: u64,
    pub symbol: String,
}

const SAMPLES_SCHEMA: &str = "message samples {
  required binary image (STRING);
  required binary image_id (STRING);
  optional binary build_id (STRING);
  required binary kind (STRING);
  required binary event (STRING);
  required int64 offset (INTEGER(64,false));
  required int64 samples;
  required double weight;
  optional int64 slice_start (TIMESTAMP(MILLIS,true));
  optional int64 slice_seconds;
  optional binary command (STRING);
}";

const SYMBOLS_SCHEMA: &str = "message symbols {
  required binary image_id (STRING);
  optional binary build_id (STRING);
  required binary image (STRING);
  required int64 start (INTEGER(64,false));
  required int64 end (INTEGER(64,false));
  required binary symbol (STRING);
}";

fn props() -> Result<Arc<WriterProperties>> {
    Ok(Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
            .set_created_by(format!("dcpiexport {}", env!("CARGO_PKG_VERSION")))
            .build(),
    ))
}

fn strings<'a>(c: &mut SerializedColumnWriter<'_>, v: impl Iterator<Item = &'a str>) -> Result<()> {
    let vals: Vec<ByteArray> = v.map(|s| ByteArray::from(s.as_bytes().to_vec())).collect();
    c.typed::<ByteArrayType>().write_batch(&vals, None, None)?;
    Ok(())
}

fn opt_strings<'a>(
    c: &mut SerializedColumnWriter<'_>,
    v: impl Iterator<Item = Option<&'a str>>,
) -> Result<()> {
    let mut vals = Vec::new();
    let mut defs = Vec::new();
    for s in v {
        match s {
            Some(s) => {
                vals.push(ByteArray::from(s.as_bytes().to_vec()));
                defs.push(1);
            }
            None => defs.push(0),
        }
    }
    c.typed::<ByteArrayType>().write_batch(&vals, Some(&defs), None)?;
    Ok(())
}

/// Optional integers (`None` is null), each mapped by `f` to its stored value.
fn opt_i64s(
    c: &mut SerializedColumnWriter<'_>,
    v: impl Iterator<Item = Option<u64>>,
    f: impl Fn(u64) -> i64,
) -> Result<()> {
    let mut vals = Vec::new();
    let mut defs = Vec::new();
    for x in v {
        match x {
            Some(x) => {
                vals.push(f(x));
                defs.push(1);
            }
            None => defs.push(0),
        }
    }
    c.typed::<Int64Type>().write_batch(&vals, Some(&defs), None)?;
    Ok(())
}

fn u64s(c: &mut SerializedColumnWriter<'_>, v: impl Iterator<Item = u64>) -> Result<()> {
    // UINT64 is stored in the INT64 physical type, bit for bit.
    let vals: Vec<i64> = v.map(u64::cast_signed).collect();
    c.typed::<Int64Type>().write_batch(&vals, None, None)?;
    Ok(())
}

/// Write `columns` in schema order, one closure per column.
type ColumnFn<'r> = Box<dyn Fn(&mut SerializedColumnWriter<'_>) -> Result<()> + 'r>;

fn write(schema: &str, columns: Vec<ColumnFn<'_>>) -> Result<Vec<u8>> {
    let schema = Arc::new(parse_message_type(schema)?);
    let mut w = SerializedFileWriter::new(Vec::new(), schema, props()?)?;
    let mut rg = w.next_row_group()?;
    for f in &columns {
        let Some(mut c) = rg.next_column()? else {
            return Err(ParquetError::General("schema has fewer columns".into()));
        };
        f(&mut c)?;
        c.close()?;
    }
    rg.close()?;
    w.into_inner()
}

/// The `samples` table of one host-epoch.
pub(crate) fn samples(rows: &[SampleRow]) -> Result<Vec<u8>> {
    write(
        SAMPLES_SCHEMA,
        vec![
            Box::new(|c| strings(c, rows.iter().map(|r| r.image.as_str()))),
            Box::new(|c| strings(c, rows.iter().map(|r| r.image_id.as_str()))),
            Box::new(|c| opt_strings(c, rows.iter().map(|r| r.build_id.as_deref()))),
            Box::new(|c| strings(c, rows.iter().map(|r| r.kind))),
            Box::new(|c| strings(c, rows.iter().map(|r| r.event.as_str()))),
            Box::new(|c| u64s(c, rows.iter().map(|r| r.offset))),
            Box::new(|c| {
                let v: Vec<i64> = rows.iter().map(|r| r.samples.cast_signed()).collect();
                c.typed::<Int64Type>().write_batch(&v, None, None).map(|_| ())
            }),
            Box::new(|c| {
                let v: Vec<f64> = rows.iter().map(|r| r.weight).collect();
                c.typed::<DoubleType>().write_batch(&v, None, None).map(|_| ())
            }),
            // A UTC timestamp in milliseconds (Parquet has no seconds unit).
            Box::new(|c| {
                opt_i64s(c, rows.iter().map(|r| r.slice_start), |s| {
                    i64::try_from(s).unwrap_or(i64::MAX / 1000).saturating_mul(1000)
                })
            }),
            Box::new(|c| opt_i64s(c, rows.iter().map(|r| r.slice_seconds), u64::cast_signed)),
            Box::new(|c| opt_strings(c, rows.iter().map(|r| r.command.as_deref()))),
        ],
    )
}

/// The `symbols` table.
pub(crate) fn symbols(rows: &[SymbolRow]) -> Result<Vec<u8>> {
    write(
        SYMBOLS_SCHEMA,
        vec![
            Box::new(|c| strings(c, rows.iter().map(|r| r.image_id.as_str()))),
            Box::new(|c| opt_strings(c, rows.iter().map(|r| r.build_id.as_deref()))),
            Box::new(|c| strings(c, rows.iter().map(|r| r.image.as_str()))),
            Box::new(|c| u64s(c, rows.iter().map(|r| r.start))),
            Box::new(|c| u64s(c, rows.iter().map(|r| r.end))),
            Box::new(|c| strings(c, rows.iter().map(|r| r.symbol.as_str()))),
        ],
    )
}
