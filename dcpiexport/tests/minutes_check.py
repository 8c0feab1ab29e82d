"""Samples per minute of the exported samples table, as DuckDB groups them by slice_start.

Usage: python3 minutes_check.py OUTPUT_DIR EVENT  ->  JSON on stdout:
  {"minutes": {"UNIX_SECONDS": N}, "unsliced": N, "total": N}
Exits 3 with the reason on stderr when duckdb is missing (the Rust test skips then).
"""
import json
import sys

try:
    import duckdb
except ImportError as e:
    print(f"python package missing: {e} (pip install duckdb)", file=sys.stderr)
    sys.exit(3)

out, event = sys.argv[1], sys.argv[2]
con = duckdb.connect()
con.execute("SET TimeZone = 'UTC'")
con.execute(f"""CREATE VIEW samples AS SELECT * FROM
  read_parquet('{out}/samples/*/*/*.parquet', hive_partitioning = true)""")
# The query EXPORT.md gives for a timeline.
rows = con.execute("""
  SELECT epoch(date_trunc('minute', slice_start))::BIGINT AS minute, sum(samples)
  FROM samples WHERE slice_start IS NOT NULL AND event = ?
  GROUP BY minute ORDER BY minute""", [event]).fetchall()
unsliced = con.execute(
    "SELECT coalesce(sum(samples), 0) FROM samples WHERE slice_start IS NULL AND event = ?",
    [event]).fetchone()[0]
total = con.execute("SELECT sum(samples) FROM samples WHERE event = ?", [event]).fetchone()[0]
print(json.dumps({"minutes": {str(m): int(n) for m, n in rows}, "unsliced": int(unsliced),
                  "total": int(total)}))
