"""Reports over the ledger: costs per tier, key or task, and live quality."""
