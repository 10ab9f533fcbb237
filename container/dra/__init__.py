"""The Kubernetes DRA driver ``gpu.xpu-runtime-kit.io``: its ResourceSlice model, its API-server client and the
vendored kubelet plugin protos (``container/dra/api``)."""
