//! Serves folders as hub repositories on loopback, for the SDK, UI and
//! desktop tests that pull models without touching the internet:
//! `shoal-hub-fixture ORG/NAME=DIR...` prints its endpoint and runs until killed.
//! Weights (`.gguf`, `.safetensors`) are listed as LFS files with a sha256.
use sha2::Digest;
use shoal_hub_fixture::{FixtureFile, FixtureRepo, HubFixture};

fn main() {
    let mut repos = Vec::new();
    for arg in std::env::args().skip(1) {
        let Some((id, dir)) = arg.split_once('=') else {
            eprintln!("usage: shoal-hub-fixture ORG/NAME=DIR...");
            std::process::exit(2);
        };
        let mut files = Vec::new();
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("{dir}: {e}");
                std::process::exit(2);
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            let lfs = name.ends_with(".gguf") || name.ends_with(".safetensors");
            files.push(FixtureFile::new(&name, bytes, lfs));
        }
        repos.push(FixtureRepo {
            id: id.to_string(),
            commit: hex::encode(&sha2::Sha256::digest(id.as_bytes())[..20]),
            files,
            token: None,
        });
    }
    let hub = HubFixture::start(repos);
    println!("hub fixture listening on {}", hub.endpoint);
    loop {
        std::thread::park();
    }
}
