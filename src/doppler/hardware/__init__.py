"""The cluster model: devices and links (cluster), the roofline cost model's bytes moved (traffic), per-op
costs on a cluster (costs), cluster files (files) and the presets from datasheets (presets)."""
