#!/bin/sh
# The compose testnet's init service (installed in the image as meshd-compose-init): issue a
# mesh CA and one identity per node into the mesh folder (a shared volume), and write each
# node's config, whose bootstrap list names the first node by its compose service name.
# Idempotent: an existing CA and identities are kept (so are peer ids); configs are rewritten.
#
#   MESHD_NODES       node names = compose service names, first = bootstrap (default: node1 node2 node3)
#   MESHD_MESH_DIR    the mesh folder (default /mesh): ca/, and nodes/NAME/{node.key,...,meshd.toml}
#   MESHD_P2P_PORT    libp2p port of every node (default 4001)
#   MESHD_ADVERT_INTERVAL_S, MESHD_ENGINE_THREADS: written into every config (default 2.0, 1)
set -eu
dir="${MESHD_MESH_DIR:-/mesh}"
nodes="${MESHD_NODES:-node1 node2 node3}"
port="${MESHD_P2P_PORT:-4001}"
advert="${MESHD_ADVERT_INTERVAL_S:-2.0}"
threads="${MESHD_ENGINE_THREADS:-1}"
umask 077

if [ ! -f "$dir/ca/ca.key" ]; then
    meshd keys init-ca --dir "$dir/ca" >/dev/null
fi
for n in $nodes; do
    if [ ! -f "$dir/nodes/$n/node.cert" ]; then
        meshd keys issue "$n" --dir "$dir/ca" --out "$dir/nodes/$n" --label region=compose \
            --force >/dev/null
        echo "meshd-compose-init: issued $n"
    fi
done

peer_id() {
    meshd keys show --json "$dir/nodes/$1/node.cert" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["peer_id"])'
}
first=""
for n in $nodes; do
    if [ -z "$first" ]; then
        first="$n"
        bootstrap=""
    else
        bootstrap="\"/dns4/$first/tcp/$port/p2p/$(peer_id "$first")\""
    fi
    # Paths are relative to the config's folder. Peers reach a node by its service name, which
    # compose's DNS resolves on the compose network; it listens on every address of its container.
    cat >"$dir/nodes/$n/meshd.toml" <<TOML
# written by meshd-compose-init; rewritten on every \`docker compose up\`
[node]
name = "$n"
data_dir = "state"
socket = "meshd.sock"
listen = ["/ip4/0.0.0.0/tcp/$port"]
announce = ["/dns4/$n/tcp/$port"]
bootstrap = [$bootstrap]

[gossip]
advert_interval_s = $advert

[engine]
threads = $threads
TOML
    python3 -c 'import sys; from meshd.config import load_config; load_config(sys.argv[1])' \
        "$dir/nodes/$n/meshd.toml"
done
echo "meshd-compose-init: mesh folder $dir ready; nodes: $nodes (bootstrap $first)"
