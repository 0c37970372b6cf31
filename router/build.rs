// Compiles proto/generate.proto, the single source of the shard protocol, and records the
// git commit being built (for `textgen_build_info` and `/info`).
use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../proto/generate.proto";
    println!("cargo:rerun-if-changed={proto}");
    // Vendored protoc: a fresh machine needs no system protobuf compiler.
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&[proto], &["../proto"])?;
    println!("cargo:rustc-env=TEXTGEN_GIT_SHA={}", git_sha());
    Ok(())
}

/// `TEXTGEN_GIT_SHA` when the build sets it (an image built without `.git`), else the
/// checkout's HEAD, else "unknown".
fn git_sha() -> String {
    println!("cargo:rerun-if-env-changed=TEXTGEN_GIT_SHA");
    if let Ok(sha) = std::env::var("TEXTGEN_GIT_SHA") {
        if !sha.trim().is_empty() {
            return sha.trim().to_owned();
        }
    }
    let Some(sha) = git(&["rev-parse", "HEAD"]) else {
        return "unknown".to_owned();
    };
    // Rebuild when HEAD moves: HEAD itself, and the branch it points at (a missing path
    // would make cargo rerun this script on every build).
    for path in [git(&["rev-parse", "--git-path", "HEAD"]), head_ref_path()]
        .into_iter()
        .flatten()
        .filter(|path| std::path::Path::new(path).exists())
    {
        println!("cargo:rerun-if-changed={path}");
    }
    sha
}

fn head_ref_path() -> Option<String> {
    let branch = git(&["symbolic-ref", "-q", "HEAD"])?;
    git(&["rev-parse", "--git-path", &branch])
}

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}
