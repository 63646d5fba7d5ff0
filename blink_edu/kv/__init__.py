"""KV memory: the block-first KV pool and the block manager (block tables, Dirty/Synced)."""
