"""Bytes only: blocks, SSTs, bloom filters, checksummed envelopes. No I/O here."""
