"""fleetctl as an xDS control plane for Envoy: an ADS server over gRPC (state of the world)
that serves the clusters, routes and runtime weights the Envoy gateway kind renders, and
tracks which version each Envoy ACKed or NACKed (docs/xds.md)."""
