"""The event log as a Recall source: project events into stream records, index them by seq."""
