"""Keys and encryption: the master key, per-subject data keys, blind indexes."""
