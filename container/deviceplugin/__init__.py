"""xpu-device-plugin: kubelet device plugin over xpu-healthd's public gRPC API (whole GPUs, MIG and TDM slices)."""
