#!/bin/sh
# pip in the image build, trusting the build machine's CA bundle where build.sh passes one
# (`--secret id=pip-ca`): CI machines behind a TLS-intercepting proxy. A secret mount: nothing of
# it stays in the image, and a build without it uses the image's own CA certificates.
if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi
exec /opt/venv/bin/python -m pip "$@"
