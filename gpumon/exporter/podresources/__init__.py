"""Python gRPC stubs of the kubelet pod-resources v1 API, generated from ``api.proto`` (copied
from ``k8s.io/kubelet``) by ``hack/gen-podresources.sh``. Do not edit the ``api_pb2*`` files."""
