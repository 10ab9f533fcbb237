"""The container layer: front ends that give the daemon's cards to containers (the kubelet device plugin in
``deviceplugin/``, the Kubernetes DRA driver in ``dra/``), talking to the daemon only through its public gRPC API."""
