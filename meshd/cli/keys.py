"""`meshd keys`: the mesh CA, node identities, revocation, and a look inside key files.

``meshd.net.identity`` (and with it libp2p, about a second to import) is imported only when an
action runs, so ``meshd --help`` stays quick.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from meshd.core.cert import (
    CERT_KIND,
    MAX_SERIAL,
    AttestationRejected,
    Certificate,
    ca_key_id,
    check_certificate,
    decode_certificate,
    issue_certificate,
    peer_id_of,
    public_key_bytes,
    verify_signature,
)
from meshd.core.crl import (
    CRL_KIND,
    MAX_REVOCATION_LIST_BYTES,
    RevocationList,
    decode_revocation_list,
    sign_revocation_list,
    verify_revocation_list,
)
from meshd.core.signed import detect_kind
from meshd.errors import KeyFileError, LocalError, MeshdError
from meshd.exitcodes import Exit
from meshd.paths import state_home

DEFAULT_DAYS = 365
MAX_DAYS = 3650

DESCRIPTION = """\
Keys of a meshd mesh. One Ed25519 CA per mesh signs a certificate for each node, binding the
node's libp2p peer ID to its name, roles and labels for a validity window. On every connection
both sides prove their certificate inside the Noise channel; a peer without a valid one is cut
off before it reaches any meshd protocol. See keys/README.md.

  meshd keys init-ca                      create the CA (once per mesh)
  meshd keys issue gw-eu-1 --role gateway --label region=eu-west
  meshd keys revoke 7                     add serial 7 to the signed revocation list
  meshd keys push-revocations             hand that list to a running node; gossip spreads it
  meshd keys show FILE                    what a key, certificate or revocation list holds
"""


def _default_ca_dir() -> Path:
    return state_home() / "ca"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "keys",
        help="create the mesh CA, issue and revoke node certificates",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=_help(p))
    ks = p.add_subparsers(dest="keys_command", metavar="ACTION")
    dir_help = "the CA directory (default: $MESHD_HOME/ca, else ~/.local/state/meshd/ca)"

    q = ks.add_parser(
        "init-ca",
        help="create the mesh CA key pair",
        description="Create the mesh CA: DIR/ca.key (Ed25519, mode 0600; keep it offline if you "
        "can) and DIR/ca.pub (give it to every node). Refuses to replace an existing CA.",
    )
    q.add_argument("--dir", type=Path, default=None, help=dir_help)
    q.set_defaults(func=run_init_ca)

    q = ks.add_parser(
        "issue",
        help="create a node identity and its certificate",
        description="Create a node identity in OUT: node.key (a fresh libp2p Ed25519 key, mode "
        "0600), node.cert (the CA's certificate binding its peer ID to NAME, roles, labels and "
        "a validity window, with the next serial), ca.pub, and revoked.crl if the CA has one. "
        "Copy OUT to the node and point its config's [keys] at it.",
    )
    q.add_argument("name", metavar="NAME", type=_node_name, help="node name, e.g. gw-eu-1")
    q.add_argument("--dir", type=Path, default=None, help=dir_help)
    q.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write the node files (default DIR/nodes/NAME)",
    )
    q.add_argument(
        "--role",
        action="append",
        default=[],
        type=_role,
        help="a role such as gateway or worker (repeat for several)",
    )
    q.add_argument(
        "--label",
        action="append",
        default=[],
        type=_label,
        metavar="KEY=VALUE",
        help="a label such as region=eu-west or residency=eu (repeat for several)",
    )
    q.add_argument(
        "--days",
        type=_days,
        default=DEFAULT_DAYS,
        help=f"validity in days from now (default {DEFAULT_DAYS}, at most {MAX_DAYS})",
    )
    q.add_argument("--force", action="store_true", help="replace existing files in OUT")
    q.set_defaults(func=run_issue)

    q = ks.add_parser(
        "revoke",
        help="add serials to the CA-signed revocation list",
        description="Add SERIALs to DIR/revoked.crl and sign it with a version one higher. A "
        "running mesh spreads the newer list by gossip and every node closes its connections "
        "to the revoked peers; a node started later reads it from its [keys] revocations file.",
    )
    q.add_argument("serials", metavar="SERIAL", nargs="+", type=_serial, help="serial to revoke")
    q.add_argument("--dir", type=Path, default=None, help=dir_help)
    q.set_defaults(func=run_revoke)

    q = ks.add_parser(
        "push-revocations",
        help="hand a revocation list to a running daemon, which spreads it by gossip",
        description="Send a CA-signed revocation list (default: DIR/revoked.crl, as written by "
        "`meshd keys revoke`) to a running daemon over its control socket. The daemon checks "
        "the CA signature, and if the list's version is newer than the one in force it applies "
        "it: it closes its connections to the revoked peers at once, drops them from its peer "
        "table, refuses their future connections, saves the list as data_dir/revocations.bin "
        "(so it holds across restarts) and gossips it; every other node does the same when the "
        "gossip reaches it, within seconds. One node is enough. A list whose version is not "
        "newer changes nothing. No CA private key is needed: the list carries its signature.",
        epilog="example: meshd keys revoke 7 && meshd keys push-revocations --socket "
        "/run/meshd/meshd.sock",
    )
    q.add_argument(
        "file",
        metavar="FILE",
        type=Path,
        nargs="?",
        default=None,
        help="the revocation list to push (default: DIR/revoked.crl)",
    )
    q.add_argument("--dir", type=Path, default=None, help=dir_help)
    q.add_argument(
        "--socket",
        metavar="PATH",
        help="control socket of the daemon to hand it to (default: $MESHD_SOCKET, the system "
        "daemon's /run/meshd/meshd.sock, else the first node of the last `meshd testnet up`)",
    )
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(func=run_push_revocations)

    q = ks.add_parser(
        "list",
        help="list the certificates this CA issued",
        description="List DIR/issued.tsv with each certificate's state (valid, expired, revoked).",
    )
    q.add_argument("--dir", type=Path, default=None, help=dir_help)
    q.add_argument("--json", action="store_true", help="print one JSON array")
    q.set_defaults(func=run_list)

    q = ks.add_parser(
        "show",
        help="print what a certificate, revocation list or key file holds",
        description="Print a certificate (node.cert), revocation list (revoked.crl), public key "
        "(ca.pub) or private key file (its public half and peer ID only, never the secret). "
        "Signatures are checked when a ca.pub is beside FILE or given with --ca.",
    )
    q.add_argument("file", metavar="FILE", type=Path)
    q.add_argument("--ca", type=Path, default=None, help="CA public key to check signatures with")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(func=run_show)


def _help(parser: argparse.ArgumentParser) -> Any:
    def show_help(args: argparse.Namespace) -> int:
        parser.print_help()
        return int(Exit.USAGE)

    return show_help


# --------------------------------------------------------------------------- argument types


def _checked(value: str, **fields: Any) -> str:
    try:
        Certificate(
            serial=1,
            name=fields.get("name", "n"),
            peer_id="1",
            public_key=bytes(32),
            not_before=0,
            not_after=1,
            ca_key_id="0" * 16,
            roles=fields.get("roles", ()),
            labels=fields.get("labels", {}),
        )
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def _node_name(value: str) -> str:
    return _checked(value, name=value)


def _role(value: str) -> str:
    return _checked(value, roles=(value,))


def _label(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"label {value!r} is not KEY=VALUE")
    _checked(value, labels={key: val})
    return key, val


def _days(value: str) -> int:
    try:
        days = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of days") from None
    if not 1 <= days <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"days must be 1..{MAX_DAYS}")
    return days


def _serial(value: str) -> int:
    try:
        serial = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a serial number") from None
    if not 1 <= serial <= MAX_SERIAL:
        raise argparse.ArgumentTypeError(f"serial must be 1..{MAX_SERIAL}")
    return serial


# --------------------------------------------------------------------------- helpers


def _ca_dir(args: argparse.Namespace) -> Path:
    return Path(args.dir) if args.dir is not None else _default_ca_dir()


def _load_ca(ca_dir: Path) -> Ed25519PrivateKey:
    from meshd.net import identity as ident

    if not (ca_dir / ident.CA_KEY_FILE).exists():
        raise KeyFileError(
            f"{ca_dir / ident.CA_KEY_FILE}: no CA here; create one with `meshd keys init-ca "
            f"--dir {ca_dir}`"
        )
    return ident.load_ca_key(ca_dir / ident.CA_KEY_FILE)


def _next_serial(ca_dir: Path) -> int:
    from meshd.net import identity as ident

    path = ca_dir / ident.SERIAL_FILE
    if not path.exists():
        return 1
    text = ident.read_file(path, max_bytes=64).decode("ascii", "replace").strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_SERIAL:
        raise KeyFileError(f"{path}: not a serial number ({text[:20]!r})")
    return int(text)


def _load_crl(ca_dir: Path, ca_public_key: bytes) -> RevocationList | None:
    from meshd.net import identity as ident

    path = ca_dir / ident.REVOCATION_FILE
    if not path.exists():
        return None
    return ident.load_revocation_list(path, ca_public_key=ca_public_key)[0]


def _utc(ts: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _read_issued(ca_dir: Path) -> list[dict[str, Any]]:
    from meshd.net import identity as ident

    path = ca_dir / ident.ISSUED_LOG_FILE
    if not path.exists():
        return []
    rows = []
    text = ident.read_file(path, max_bytes=64 << 20).decode("utf-8", "replace")
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 5 or not all(p.isdigit() for p in (parts[0], parts[3], parts[4])):
            continue  # a damaged line: skip it, the certificates themselves are what count
        rows.append(
            {
                "serial": int(parts[0]),
                "name": parts[1],
                "peer_id": parts[2],
                "not_before": int(parts[3]),
                "not_after": int(parts[4]),
            }
        )
    return rows


# --------------------------------------------------------------------------- actions


def run_init_ca(args: argparse.Namespace) -> int:
    from meshd.net import identity as ident

    ca_dir = _ca_dir(args)
    key_path = ca_dir / ident.CA_KEY_FILE
    if key_path.exists():
        raise KeyFileError(f"{key_path}: a CA already exists here; refusing to replace it")
    ident.make_private_dir(ca_dir)
    private_key = Ed25519PrivateKey.generate()
    public_key = public_key_bytes(private_key)
    ident.save_ca_key(key_path, private_key)
    ident.save_ca_public_key(ca_dir / ident.CA_PUBLIC_KEY_FILE, public_key, overwrite=True)
    print(f"created CA {ca_key_id(public_key)} in {ca_dir}")
    print(f"  {key_path}  (private, 0600: keep it safe, ideally offline)")
    print(f"  {ca_dir / ident.CA_PUBLIC_KEY_FILE}  (public: every node needs it)")
    print(f"next: meshd keys issue NAME --dir {ca_dir}")
    return int(Exit.OK)


def run_issue(args: argparse.Namespace) -> int:
    from meshd.net import identity as ident

    ca_dir = _ca_dir(args)
    ca_key = _load_ca(ca_dir)
    ca_public_key = public_key_bytes(ca_key)
    out = Path(args.out) if args.out is not None else ca_dir / "nodes" / args.name
    if (out / ident.NODE_KEY_FILE).exists() and not args.force:
        raise KeyFileError(
            f"{out / ident.NODE_KEY_FILE}: already exists; pass --force to replace that identity"
        )
    labels = dict(args.label)
    if len(labels) != len(args.label):
        raise LocalError("a label key is given twice")
    serial = _next_serial(ca_dir)
    now = int(time.time())
    key_pair = ident.generate_node_key_pair()
    try:
        cert_bytes = issue_certificate(
            ca_private_key=ca_key,
            serial=serial,
            name=args.name,
            node_public_key=ident.node_public_key_bytes(key_pair),
            not_before=now,
            not_after=now + args.days * 86400,
            roles=args.role,
            labels=labels,
        )
    except ValueError as err:
        raise LocalError(f"cannot issue: {err}") from None
    ident.write_file(
        ca_dir / ident.SERIAL_FILE, f"{serial + 1}\n".encode(), mode=0o600, overwrite=True
    )
    ident.save_identity(out, key_pair, cert_bytes, ca_public_key, overwrite=args.force)
    crl_path = ca_dir / ident.REVOCATION_FILE
    if crl_path.exists():
        ident.save_revocation_list(
            out / ident.REVOCATION_FILE,
            ident.read_file(crl_path, max_bytes=MAX_REVOCATION_LIST_BYTES),
        )
    peer_id = peer_id_of(ident.node_public_key_bytes(key_pair))
    log = ca_dir / ident.ISSUED_LOG_FILE
    try:
        with open(log, "a", encoding="ascii") as f:
            f.write(f"{serial}\t{args.name}\t{peer_id}\t{now}\t{now + args.days * 86400}\n")
    except OSError as err:
        raise KeyFileError(f"{log}: cannot append: {err.strerror}") from None
    print(f"issued {args.name} serial={serial} peer_id={peer_id}")
    print(f"  valid {_utc(now)} to {_utc(now + args.days * 86400)}")
    if args.role:
        print(f"  roles  {', '.join(sorted(set(args.role)))}")
    if labels:
        print(f"  labels {' '.join(f'{k}={v}' for k, v in sorted(labels.items()))}")
    print(
        f"  files  {out}/{{{ident.NODE_KEY_FILE},{ident.NODE_CERT_FILE},{ident.CA_PUBLIC_KEY_FILE}}}"
    )
    return int(Exit.OK)


def run_revoke(args: argparse.Namespace) -> int:
    from meshd.net import identity as ident

    ca_dir = _ca_dir(args)
    ca_key = _load_ca(ca_dir)
    ca_public_key = public_key_bytes(ca_key)
    current = _load_crl(ca_dir, ca_public_key)
    serials = set(current.serials if current else ()) | set(args.serials)
    rl = RevocationList(
        version=(current.version + 1) if current else 1,
        issued_at=int(time.time()),
        ca_key_id=ca_key_id(ca_public_key),
        serials=frozenset(serials),
    )
    path = ca_dir / ident.REVOCATION_FILE
    ident.save_revocation_list(path, sign_revocation_list(rl, ca_key))
    names = {row["serial"]: row["name"] for row in _read_issued(ca_dir)}
    for serial in sorted(set(args.serials)):
        what = names.get(serial, "never issued by this CA")
        print(f"revoked serial={serial} ({what})")
    print(f"revocation list version {rl.version}: {len(serials)} serial(s) -> {path}")
    print(f"next: hand it to any running node with `meshd keys push-revocations {path} "
          "[--socket PATH]`;")
    print("the mesh spreads it by gossip; nodes started later load it from [keys] revocations")
    return int(Exit.OK)


def run_push_revocations(args: argparse.Namespace) -> int:
    import trio

    from meshd.control.client import call, find_socket
    from meshd.core.messages import MessageType
    from meshd.errors import RemoteError
    from meshd.net import identity as ident

    path = Path(args.file) if args.file is not None else _ca_dir(args) / ident.REVOCATION_FILE
    if not path.exists():
        raise LocalError(
            f"{path}: no revocation list there; create one with `meshd keys revoke SERIAL`"
        )
    data = ident.read_file(path, max_bytes=MAX_REVOCATION_LIST_BYTES, private=False)
    try:
        if detect_kind(data) != CRL_KIND:
            raise LocalError(f"{path}: not a revocation list (see `meshd keys show {path}`)")
        rl = decode_revocation_list(data)
    except LocalError:
        raise
    except MeshdError as err:
        raise LocalError(f"{path}: not a usable revocation list: {err}") from None
    sock = find_socket(args.socket)
    try:
        reply = trio.run(call, str(sock), MessageType.PUSH_REVOCATION, {"crl": data})
    except RemoteError as err:
        if err.code in ("malformed", "unattested"):
            # the daemon checked the list and refused it (another CA, bad signature)
            raise LocalError(f"the daemon refused {path}: {err}") from None
        raise
    info = dict(reply.get("data") or {})
    in_force = int(info.get("version") or 0)
    gone = [str(p) for p in info.get("disconnected") or []]
    node = f"the daemon at {sock}"
    result = {
        "file": str(path),
        "socket": str(sock),
        "pushed_version": rl.version,
        "version_in_force": in_force,
        "applied": in_force == rl.version,
        "newer_in_force": in_force > rl.version,
        "disconnected": gone,
        "revoked_serials": sorted(rl.serials),
    }
    if args.json:
        print(json.dumps(result))
        return int(Exit.OK)
    if in_force > rl.version:
        print(f"{node} already holds version {in_force}, newer than {path} (version "
              f"{rl.version}); nothing changed")
        return int(Exit.OK)
    print(f"revocation list version {rl.version} ({len(rl.serials)} serial(s)) in force on {node}")
    print(f"  disconnected {len(gone)} peer(s) now" + (f": {', '.join(gone)}" if gone else ""))
    print("  the list spreads by gossip; every node closes its connections to revoked peers")
    return int(Exit.OK)


def run_list(args: argparse.Namespace) -> int:
    from meshd.net import identity as ident

    ca_dir = _ca_dir(args)
    ca_public_key = ident.load_ca_public_key(ca_dir / ident.CA_PUBLIC_KEY_FILE)
    crl = _load_crl(ca_dir, ca_public_key)
    revoked = crl.serials if crl else frozenset()
    now = time.time()
    rows = _read_issued(ca_dir)
    for row in rows:
        if row["serial"] in revoked:
            row["state"] = "revoked"
        elif now >= row["not_after"]:
            row["state"] = "expired"
        else:
            row["state"] = "valid"
    if args.json:
        print(json.dumps(rows))
        return int(Exit.OK)
    print(f"{'SERIAL':>6}  {'NAME':<20} {'STATE':<8} {'NOT AFTER':<23} PEER ID")
    for row in rows:
        print(
            f"{row['serial']:>6}  {row['name']:<20} {row['state']:<8} "
            f"{_utc(row['not_after']):<23} {row['peer_id']}"
        )
    return int(Exit.OK)


def run_show(args: argparse.Namespace) -> int:
    from meshd.net import identity as ident

    path = Path(args.file)
    ca_path = Path(args.ca) if args.ca is not None else path.parent / ident.CA_PUBLIC_KEY_FILE
    ca_public_key = ident.load_ca_public_key(ca_path) if ca_path.exists() else None
    head = ident.read_file(path, max_bytes=MAX_REVOCATION_LIST_BYTES, private=False)
    kind = detect_kind(head)
    if kind == CERT_KIND:
        info = _show_certificate(head, ca_public_key, ca_path)
    elif kind == CRL_KIND:
        info = _show_revocation_list(head, ca_public_key, ca_path)
    elif b"PRIVATE KEY" in head:
        info = _show_private_key(path)
    elif b"PUBLIC KEY" in head:
        public_key = ident.load_ca_public_key(path)
        info = {
            "kind": "public key",
            "key_id": ca_key_id(public_key),
            "public_key": public_key.hex(),
        }
    else:
        raise LocalError(f"{path}: not a meshd certificate, revocation list or key file")
    if args.json:
        print(json.dumps(info))
    else:
        print(f"{info.pop('kind')}  {path}")
        for key, value in info.items():
            if isinstance(value, list):
                value = ", ".join(str(v) for v in value) or "-"
            elif isinstance(value, dict):
                value = " ".join(f"{k}={v}" for k, v in value.items()) or "-"
            print(f"  {key:<13} {value}")
    return int(Exit.OK)


def _signature_state(check: Any, data: bytes, ca_public_key: bytes | None, ca_path: Path) -> str:
    if ca_public_key is None:
        return "not checked (no ca.pub beside the file; pass --ca)"
    try:
        check(data, ca_public_key=ca_public_key)
    except MeshdError as err:
        return f"INVALID under {ca_path}: {err}"
    return f"valid (CA {ca_key_id(ca_public_key)}, {ca_path})"


def _show_certificate(data: bytes, ca_public_key: bytes | None, ca_path: Path) -> dict[str, Any]:
    try:
        cert = decode_certificate(data)
    except AttestationRejected as err:
        raise LocalError(f"not a usable certificate: {err}") from None
    now = time.time()
    try:
        check_certificate(cert, remote_peer_id=cert.peer_id, now=now, clock_skew_s=0)
        state = "valid now"
    except AttestationRejected as err:
        state = err.reason.replace("_", " ")
    return {
        "kind": "certificate",
        "name": cert.name,
        "serial": cert.serial,
        "peer_id": cert.peer_id,
        "roles": list(cert.roles),
        "labels": dict(cert.labels),
        "not_before": _utc(cert.not_before),
        "not_after": _utc(cert.not_after),
        "state": state,
        "ca_key_id": cert.ca_key_id,
        "signature": _signature_state(_verify_certificate_signature, data, ca_public_key, ca_path),
    }


def _verify_certificate_signature(data: bytes, *, ca_public_key: bytes) -> None:
    verify_signature(data, ca_public_key=ca_public_key)


def _show_revocation_list(
    data: bytes, ca_public_key: bytes | None, ca_path: Path
) -> dict[str, Any]:
    try:
        rl = decode_revocation_list(data)
    except MeshdError as err:
        raise LocalError(f"not a usable revocation list: {err}") from None
    return {
        "kind": "revocation list",
        "version": rl.version,
        "issued_at": _utc(rl.issued_at),
        "ca_key_id": rl.ca_key_id,
        "revoked": sorted(rl.serials),
        "signature": _signature_state(verify_revocation_list, data, ca_public_key, ca_path),
    }


def _show_private_key(path: Path) -> dict[str, Any]:
    from meshd.net import identity as ident

    key_pair = ident.load_node_key(path)  # refuses unsafe permissions like the daemon does
    public_key = ident.node_public_key_bytes(key_pair)
    return {
        "kind": "private key",
        "public_key": public_key.hex(),
        "peer_id": peer_id_of(public_key),
        "as_ca_key_id": ca_key_id(public_key),
        "permissions": "owner only (checked)",
    }
