//! dcpiprof: per-image and per-symbol reports from the database.
