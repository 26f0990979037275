"""The control plane: one pool's `Controller` in a live loop, with its operator API
(`tidal controller`).

`loop` (bus in, control step, bus out; leadership), `plane` (a pool's policy, pins,
events, persistence and rollout gate), `app` (operator API), `metrics`, `cli`.
"""
