# The kuikproxy image the chart runs (charts/kuikproxy: `image.repository`): the service, the
# injected sidecar and the injection webhook are the same program.
#
#   podman build -t ghcr.io/kuikproxy/kuikproxy:0.1.0 .
#
# Non-root (65532, as the chart's securityContext says), a read-only root filesystem works:
# kuikproxy writes only to its state path and /tmp, both volumes in the chart. python3 stays on
# PATH: the injected sidecar's probes run it (they reach the loopback listener from inside).
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kuikproxy ./kuikproxy
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.12-slim
COPY --from=build /install /usr/local
USER 65532:65532
WORKDIR /var/lib/kuikproxy
EXPOSE 7439
ENTRYPOINT ["kuikproxy"]
CMD ["serve"]
