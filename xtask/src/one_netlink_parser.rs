//! The invariant "one netlink parser" (ARCHITECTURE.md): only `crates/dataplane/src/netlink/`
//! opens netlink sockets or reads netlink bytes. Checked by looking for the types and
//! constants that doing so takes (netlink-packet-core's buffers, netlink-sys, AF_NETLINK)
//! in every other source file of the project.

use crate::module_cycles::rust_files;
use std::fs;
use std::path::{Path, PathBuf};

/// Where the one netlink layer lives.
const LAYER: &str = "crates/dataplane/src/netlink";

/// What reading netlink bytes or opening a netlink socket takes.
const NEEDLES: [&str; 7] = [
    "NetlinkBuffer",
    "NlasIterator",
    "NlaBuffer",
    "netlink_packet_",
    "netlink_sys",
    "AF_NETLINK",
    "NETLINK_ROUTE",
];

/// Every `file: needle` outside the layer, under `root`.
fn readers_outside_the_layer(root: &Path) -> Vec<String> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(root.join("crates"))
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.extend(
        [
            "benches",
            "fuzz/src",
            "fuzz/tests",
            "fuzz/examples",
            "xtask/src",
        ]
        .map(|d| root.join(d)),
    );
    let mut files = Vec::new();
    for dir in &dirs {
        rust_files(dir, &mut files);
    }
    let this = Path::new(file!()).file_name();
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(root).unwrap_or(&file);
        if relative.starts_with(LAYER) || relative.file_name() == this {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap_or_default();
        for needle in NEEDLES.iter().filter(|n| text.contains(*n)) {
            found.push(format!("{}: {needle}", relative.display()));
        }
    }
    found
}

#[test]
fn only_the_netlink_layer_reads_netlink() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = root.canonicalize().unwrap_or(root);
    assert!(root.join(LAYER).is_dir(), "no {LAYER}");
    let found = readers_outside_the_layer(&root);
    assert!(
        found.is_empty(),
        "netlink read outside {LAYER} (use tunneld_dataplane::netlink):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_reader_elsewhere_is_found() {
    let dir = std::env::temp_dir().join(format!("one-netlink-parser-{}", std::process::id()));
    let elsewhere = dir.join("crates/tunneld/src");
    let layer = dir.join(LAYER);
    fs::create_dir_all(&elsewhere).unwrap();
    fs::create_dir_all(&layer).unwrap();
    fs::write(
        layer.join("wire.rs"),
        "use netlink_packet_core::NlasIterator;",
    )
    .unwrap();
    fs::write(
        elsewhere.join("lib.rs"),
        "fn f(b: &[u8]) { NlasIterator::new(b); }",
    )
    .unwrap();
    let found = readers_outside_the_layer(&dir);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, ["crates/tunneld/src/lib.rs: NlasIterator"]);
}
