"""Sums of the exported samples table as DuckDB and ClickHouse (chdb) compute them.

Usage: python3 sql_check.py OUTPUT_DIR  ->  JSON on stdout:
  {"duckdb": {"total": N, "per": {"IMAGE_ID|EVENT": N}, "partitions": N},
   "chdb": {... same ..., "summing_total": N}}
Exits 3 with the reason on stderr when a package is missing (the Rust test skips then).
"""
import json
import sys

try:
    import chdb
    import chdb.session
    import duckdb
except ImportError as e:
    print(f"python package missing: {e} (pip install duckdb chdb)", file=sys.stderr)
    sys.exit(3)

out = sys.argv[1]
glob = f"{out}/samples/*/*/*.parquet"
res = {}

con = duckdb.connect()
src = f"read_parquet('{glob}', hive_partitioning = true)"
total = con.execute(f"SELECT sum(samples) FROM {src}").fetchone()[0]
per = con.execute(f"SELECT image_id, event, sum(samples) FROM {src} GROUP BY ALL").fetchall()
parts = con.execute(f"SELECT count(DISTINCT (epoch, host)) FROM {src}").fetchone()[0]
res["duckdb"] = {"total": int(total), "per": {f"{i}|{e}": int(n) for i, e, n in per},
                 "partitions": int(parts)}

q = (f"SELECT image_id, event, sum(samples) AS n FROM file('{glob}', Parquet) "
     "GROUP BY image_id, event FORMAT JSONEachRow")
rows = [json.loads(line) for line in str(chdb.query(q)).splitlines() if line.strip()]
tot = json.loads(str(chdb.query(f"SELECT sum(samples) AS n FROM file('{glob}', Parquet) "
                                "FORMAT JSONEachRow")).strip())["n"]
parts = json.loads(str(chdb.query(
    f"SELECT uniqExact(extract(_path, 'epoch=([^/]+)'), extract(_path, 'host=([^/]+)')) AS n "
    f"FROM file('{glob}', Parquet) FORMAT JSONEachRow")).strip())["n"]
# The SummingMergeTree table of EXPORT.md, loaded from the same files.
s = chdb.session.Session()
s.query("CREATE DATABASE IF NOT EXISTS dcpi")
s.query("""CREATE TABLE dcpi.samples (
    epoch String, host LowCardinality(String), image String, image_id String,
    build_id Nullable(String), kind LowCardinality(String), event LowCardinality(String),
    offset UInt64, samples UInt64, weight Float64, slice_start DateTime64(3, 'UTC'))
  ENGINE = SummingMergeTree((samples, weight))
  ORDER BY (epoch, host, image_id, event, offset, image, kind, slice_start)""")
s.query(f"""INSERT INTO dcpi.samples
  SELECT extract(_path, 'epoch=([^/]+)') AS epoch, extract(_path, 'host=([^/]+)') AS host,
         image, image_id, build_id, kind, event, offset, samples, weight,
         ifNull(slice_start, toDateTime64(0, 3, 'UTC')) AS slice_start
  FROM file('{glob}', Parquet)""")
summing = json.loads(str(s.query(
    "SELECT sum(samples) AS n FROM dcpi.samples FINAL FORMAT JSONEachRow")).strip())["n"]
res["chdb"] = {"total": int(tot), "per": {f"{r['image_id']}|{r['event']}": int(r["n"]) for r in rows},
               "partitions": int(parts), "summing_total": int(summing)}
print(json.dumps(res))
