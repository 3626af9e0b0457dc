# Sourced by the Dockerfiles' RUN steps: when a CA bundle was given as a build input (docker/build-inputs/ca.crt, for
# pip and git behind an intercepting proxy), use it for TLS. The build stage only; never copied into a runtime image.
if [ -f /build-inputs/ca.crt ]; then
  export PIP_CERT=/build-inputs/ca.crt SSL_CERT_FILE=/build-inputs/ca.crt REQUESTS_CA_BUNDLE=/build-inputs/ca.crt \
    GIT_SSL_CAINFO=/build-inputs/ca.crt
fi
