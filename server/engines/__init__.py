"""The engines a pool steers, behind one seam (`protocols.Engine`).

`member` makes any engine a member of a pool on the bus (stats out, configs in,
fail-static); `tidal_worker` is Tidal's own batcher, `ray_serve` a Ray Serve replica
(joined from inside the deployment), `triton` a Triton model (steered from beside it).
"""
