"""Operator tools around the live side: `tidal profile`, `tidal loadgen`, `tidal demo`."""
