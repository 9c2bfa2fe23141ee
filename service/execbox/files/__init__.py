"""Files: input file objects in Redis (store, schemas), artifact blobs on disk (blobs) and the
collection of a run's output directory into artifacts (collect)."""
