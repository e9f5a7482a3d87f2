"""The kubelet pod-resources v1 API.

The exporter's own client parts, pure (no I/O): :mod:`hpack`, :mod:`h2` and :mod:`grpc_unary` make
one unary gRPC call over HTTP/2 cleartext, :mod:`protowire` and :mod:`view` decode the reply; the
asyncio shell is ``gpumon.exporter.podresources_client``.

``api.proto`` is copied from ``k8s.io/kubelet`` and the Python gRPC stubs ``api_pb2*`` generated
from it by ``hack/gen-podresources.sh`` (do not edit them): the test fixtures and devcluster's
pod-resources server use them; the exporter never imports them (.importlinter).
"""
