"""The contract as code: closed schemas, error catalog, canonical JSON, digests and ids."""
