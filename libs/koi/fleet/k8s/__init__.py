"""Koi's Kubernetes adapter, the pure half: manifests out, observed objects in.

``manifests`` turns a Koi deployment into the Deployment / LeaderWorkerSet / Service it
runs as; ``reconcile`` compares a tick's decision with what the cluster runs and says
which operations (apply, scale, delete) to perform, in make-before-break order, and maps
Kubernetes objects and events back to ``koi.cluster.Deployment`` and
``koi.fleet.ports.FleetEvent``. No API calls here: the I/O lives in
``services/k8s_backend`` (``KubernetesBackend``), which implements ``FleetBackend``.
"""
