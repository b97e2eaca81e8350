"""bench check's shipped contracts: one TOML per embedded model and engine (bench/contract.py reads them)."""
