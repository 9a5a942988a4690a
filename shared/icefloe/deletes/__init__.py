"""Row-level deletes: position delete files (v2), deletion vectors in Puffin files (v3),
and the index of which delete files apply to which data file."""
