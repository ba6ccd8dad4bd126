use super::*;
use std::collections::HashMap;

/// A fresh directory under the system temp dir for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shoal-config-unit-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

fn write(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("config.toml");
    std::fs::write(&p, text).expect("write");
    p
}

fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn flags_with(config: &Path) -> Flags {
    Flags {
        config: Some(config.to_owned()),
        ..Flags::default()
    }
}

#[test]
fn every_setting_has_a_default_but_the_optional_ones() {
    let table = default_table();
    let optional = [
        "server.db",
        "server.ollama_port",
        "model.path",
        "model.id",
        "model.draft_model",
        "model.mmproj",
        "embedding.path",
        "embedding.id",
        "cache.disk_dir",
        "mcp.file",
    ];
    for s in SETTINGS {
        let present = s.value_in(&table).is_some();
        assert_eq!(present, !optional.contains(&s.id), "{}", s.id);
    }
}

#[derive(clap::Parser)]
struct Serve {
    #[command(flatten)]
    flags: Flags,
}

#[derive(clap::Parser)]
struct Generate {
    #[command(flatten)]
    flags: ModelFlags,
}

#[test]
fn flags_come_from_the_table() {
    use clap::Parser;
    let parse = |args: &[&str]| {
        let f = Serve::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .expect("flags parse")
            .flags;
        resolve_with(&f, &env_of(&[("SHOAL_PEERS", "a:1,b:2")]), None)
    };
    let r = parse(&[
        "--port",
        "9",
        "--no-mdns",
        "--log-prompts",
        "--peer",
        "c:3",
        "--peer",
        "d:4",
        "--backend",
        "llama",
    ])
    .expect("resolve");
    let c = &r.config;
    assert_eq!(c.server.port, 9);
    assert!(!c.cluster.mdns && c.server.log_prompts);
    assert_eq!(
        c.cluster.peers,
        ["c:3", "d:4"],
        "a flag list replaces the env's"
    );
    assert_eq!(c.model.backend, shoal_engine::BackendChoice::Llama);
    assert_eq!(r.source("cluster.mdns"), Source::Flag);
    // No switch given: the lower layers stand.
    let r = parse(&[]).expect("resolve");
    assert!(r.config.cluster.mdns);
    assert_eq!(r.config.cluster.peers, ["a:1", "b:2"]);
    assert_eq!(r.source("cluster.peers"), Source::Env);
    // A value the type refuses names the flag.
    let err = parse(&["--port", "70000"]).expect_err("port out of range");
    assert!(format!("{err:#}").contains("--port"), "{err:#}");
    let err = parse(&["--queue", "many"]).expect_err("not a number");
    assert!(format!("{err:#}").contains("--queue"), "{err:#}");
    // `generate` and `bench` offer the model rows only.
    let g = Generate::try_parse_from(["generate", "--threads", "3"]).expect("model flags");
    let r = resolve_with(&g.flags.0, &env_of(&[]), None).expect("resolve");
    assert_eq!(r.config.model.threads, 3);
    assert!(Generate::try_parse_from(["generate", "--port", "1"]).is_err());
    assert!(Generate::try_parse_from(["generate", "--alias", "x"]).is_err());
}

#[test]
fn defaults_match_the_former_flag_defaults() {
    let r = resolve_with(&Flags::default(), &env_of(&[]), None).expect("resolve");
    let c = &r.config;
    assert_eq!(c.server.host.to_string(), "127.0.0.1");
    assert_eq!(c.server.port, 8421);
    assert_eq!(c.server.queue, 64);
    assert_eq!(c.cache.prefix_cache_mb, 1024);
    assert!(c.content_filter.phrases.is_empty() && c.content_filter.patterns.is_empty());
    assert!(c.model.aliases.is_empty() && c.model.path.is_none());
    assert!(r.file.is_none());
    assert_eq!(r.source("server.port"), Source::Default);
    let o = c.engine_options().expect("options");
    assert_eq!(o.queue_capacity, 64);
    assert_eq!(o.prefix_cache_bytes, 1 << 30);
    assert!(o.blocked_phrases.is_empty() && o.blocked_patterns.is_empty());
}

#[test]
fn kv_cache_tokens_is_auto_or_a_number_from_every_layer() {
    use shoal_engine::backends::llama::{KvTokens, AUTO_KV_TOKENS};
    let r = resolve_with(&Flags::default(), &env_of(&[]), None).expect("resolve");
    assert_eq!(r.config.model.kv_cache_tokens, KvTokens::Auto);
    let o = r.config.llama_options().expect("options");
    assert_eq!(o.kv_tokens, AUTO_KV_TOKENS);
    // `auto` takes its share of the pool's budget, the same the pool uses.
    assert_eq!(o.memory_budget, Some(shoal_api::pool::default_budget()));
    let dir = temp_dir("kv-tokens");
    for (text, want) in [
        ("kv_cache_tokens = 32768", KvTokens::Fixed(32768)),
        ("kv_cache_tokens = 0", KvTokens::Auto),
        ("kv_cache_tokens = \"auto\"", KvTokens::Auto),
    ] {
        let path = write(
            &dir,
            &format!("[model]\n{text}\n[models]\nmemory_budget_mb = 4096\n"),
        );
        let r = resolve_with(&flags_with(&path), &env_of(&[]), None).expect("resolve");
        assert_eq!(r.config.model.kv_cache_tokens, want, "{text}");
        let o = r.config.llama_options().expect("options");
        assert_eq!(o.kv_tokens, want.positions(), "{text}");
        assert_eq!(o.memory_budget, Some(4096 << 20), "{text}");
    }
    for (value, want) in [("auto", KvTokens::Auto), ("16384", KvTokens::Fixed(16384))] {
        let env = env_of(&[("SHOAL_KV_CACHE_TOKENS", value)]);
        let r = resolve_with(&Flags::default(), &env, None).expect("resolve");
        assert_eq!(r.config.model.kv_cache_tokens, want, "{value}");
        let mut flags = Flags::default();
        flags.set("model.kv_cache_tokens", value).expect("flag");
        let r = resolve_with(&flags, &env_of(&[]), None).expect("resolve");
        assert_eq!(r.config.model.kv_cache_tokens, want, "{value}");
    }
    let err = resolve_with(
        &Flags::default(),
        &env_of(&[("SHOAL_KV_CACHE_TOKENS", "lots")]),
        None,
    )
    .expect_err("not a number");
    assert!(
        format!("{err:#}").contains("SHOAL_KV_CACHE_TOKENS"),
        "{err:#}"
    );
}

#[test]
fn file_then_env_then_flags() {
    let dir = temp_dir("layers");
    let path = write(
        &dir,
        r#"
[server]
host = "0.0.0.0"
port = 9000
queue = 5

[cache]
prefix_cache_mb = 7

[content_filter]
phrases = ["Paris", "Rome"]
"#,
    );
    let env = env_of(&[("SHOAL_PORT", "9001"), ("SHOAL_QUEUE", "6")]);
    let mut flags = flags_with(&path);
    flags.set("server.queue", "8").expect("queue");
    flags
        .set("content_filter.phrases", "Berlin")
        .expect("phrases");
    let r = resolve_with(&flags, &env, None).expect("resolve");
    let c = &r.config;
    assert_eq!(c.server.host.to_string(), "0.0.0.0", "file over default");
    assert_eq!(c.server.port, 9001, "env over file");
    assert_eq!(c.server.queue, 8, "flag over env over file");
    assert_eq!(c.cache.prefix_cache_mb, 7);
    assert_eq!(c.content_filter.phrases, ["Berlin"], "a flag list replaces");
    assert_eq!(r.source("server.host"), Source::File);
    assert_eq!(r.source("server.port"), Source::Env);
    assert_eq!(r.source("server.queue"), Source::Flag);
    assert_eq!(r.source("content_filter.phrases"), Source::Flag);
    assert_eq!(r.source("content_filter.patterns"), Source::Default);
    let o = c.engine_options().expect("options");
    assert_eq!(o.queue_capacity, 8);
    assert_eq!(o.prefix_cache_bytes, 7 << 20);
    assert_eq!(o.blocked_phrases, ["Berlin"]);
}

#[test]
fn config_file_location() {
    let dir = temp_dir("location");
    let by_flag = write(&dir, "[server]\nport = 1\n");
    let by_env = dir.join("env.toml");
    std::fs::write(&by_env, "[server]\nport = 2\n").expect("write");
    let default = dir.join("default.toml");
    std::fs::write(&default, "[server]\nport = 3\n").expect("write");
    let env = env_of(&[(CONFIG_ENV, by_env.to_str().expect("utf8"))]);

    let port = |flags: &Flags, env: &dyn Fn(&str) -> Option<String>, d: Option<PathBuf>| {
        resolve_with(flags, env, d)
            .expect("resolve")
            .config
            .server
            .port
    };
    assert_eq!(port(&flags_with(&by_flag), &env, Some(default.clone())), 1);
    assert_eq!(port(&Flags::default(), &env, Some(default.clone())), 2);
    assert_eq!(port(&Flags::default(), &env_of(&[]), Some(default)), 3);
    // A missing default file means defaults; a missing named one is an error.
    let missing = dir.join("missing.toml");
    assert_eq!(
        port(&Flags::default(), &env_of(&[]), Some(missing.clone())),
        8421
    );
    let err =
        resolve_with(&flags_with(&missing), &env_of(&[]), None).expect_err("missing explicit file");
    assert!(format!("{err:#}").contains("missing.toml"), "{err:#}");
}

#[test]
fn invalid_files_name_the_file_and_key() {
    let dir = temp_dir("invalid");
    let check = |text: &str, expected: &[&str]| {
        let path = write(&dir, text);
        let err = resolve_with(&flags_with(&path), &env_of(&[]), None).expect_err("invalid config");
        let msg = format!("{err:#}");
        assert!(msg.contains(path.to_str().expect("utf8")), "{msg}");
        for e in expected {
            assert!(msg.contains(e), "{e:?} not in {msg}");
        }
    };
    check(
        "[server]\ncolour = 1\n",
        &["server.colour", "unknown field `colour`"],
    );
    check("[serverz]\nport = 1\n", &["serverz", "unknown field"]);
    check("[server]\nport = \"x\"\n", &["server.port", "line 2"]);
    check("[server\n", &["line 1"]);
    check(
        "[content_filter]\npatterns = [\"ok\", \"(oops\"]\n",
        &["content_filter.patterns[1]", "(oops", "config file"],
    );
    check(
        &format!("[cache]\nprefix_cache_mb = {}\n", i64::MAX),
        &["cache.prefix_cache_mb", "too large"],
    );
}

#[test]
fn bad_environment_values_name_the_variable() {
    let err = resolve_with(&Flags::default(), &env_of(&[("SHOAL_PORT", "http")]), None)
        .expect_err("bad port");
    assert!(format!("{err:#}").contains("SHOAL_PORT"), "{err:#}");
    let err = resolve_with(
        &Flags::default(),
        &env_of(&[("SHOAL_BLOCK_REGEX", "a\n[z")]),
        None,
    )
    .expect_err("bad regex");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("patterns[1]") && msg.contains("SHOAL_BLOCK_REGEX"),
        "{msg}"
    );
}

#[test]
fn environment_lists_and_empty_values() {
    let env = env_of(&[("SHOAL_BLOCK", "a\nb\n"), ("SHOAL_HOST", "")]);
    let r = resolve_with(&Flags::default(), &env, None).expect("resolve");
    assert_eq!(r.config.content_filter.phrases, ["a", "b", ""]);
    assert_eq!(r.source("server.host"), Source::Default, "empty = unset");
    let o = r.config.engine_options().expect("options");
    assert_eq!(o.blocked_phrases, ["a", "b"]);
}

#[test]
fn relative_model_path_is_taken_from_the_file_directory() {
    let dir = temp_dir("relative");
    let path = write(
        &dir,
        "[server]\ndb = \"h.sqlite\"\n[model]\npath = \"m.gguf\"\naliases = [\"x\"]\n",
    );
    let r = resolve_with(&flags_with(&path), &env_of(&[]), None).expect("resolve");
    assert_eq!(r.config.model_path(), dir.join("m.gguf"));
    assert_eq!(r.config.db_path().expect("db"), dir.join("h.sqlite"));
    let r = resolve_with(
        &flags_with(&path),
        &env_of(&[("SHOAL_DB", "/e.sqlite")]),
        None,
    )
    .expect("resolve");
    assert_eq!(r.config.db_path().expect("db"), PathBuf::from("/e.sqlite"));
    assert_eq!(r.source("server.db"), Source::Env);
    assert_eq!(r.config.model_id(), "m");
    assert_eq!(r.config.model.aliases, ["x"]);
}

#[test]
fn prices_are_one_setting_of_tables_by_model_from_the_file() {
    let dir = temp_dir("prices");
    let path = write(
        &dir,
        "[server]\nport = 9000\n\n[prices.\"qwen2.5-coder\"]\ninput_per_mtok = 3\n\
         output_per_mtok = 15.0\ncached_input_per_mtok = 0.3\n\n[prices.smollm2]\n\
         input_per_mtok = 0.1\noutput_per_mtok = 0.2\n",
    );
    let r = resolve_with(&flags_with(&path), &env_of(&[]), None).expect("resolve");
    let p = &r.config.prices;
    assert_eq!(p.len(), 2, "{p:?}");
    assert_eq!(
        p["qwen2.5-coder"].input_per_mtok, 3.0,
        "an integer is a price too"
    );
    assert_eq!(p["qwen2.5-coder"].cached_input_per_mtok, Some(0.3));
    assert_eq!(p["smollm2"].cached_input_per_mtok, None);
    assert_eq!(r.source("prices"), Source::File);
    // `shoal config` prints them, and what it prints reads back.
    let text = r.to_annotated_toml().expect("toml");
    assert!(text.contains("[prices.\"qwen2.5-coder\"]"), "{text}");
    assert!(
        text.contains(&format!("# config file {}", path.display())),
        "{text}"
    );
    let back: Config = toml::from_str(&text).expect("output is a valid config");
    assert_eq!(&back.prices, p);
    assert_eq!(back.server.port, 9000);
    // None set: printed empty, still valid.
    let r = resolve_with(&Flags::default(), &env_of(&[]), None).expect("resolve");
    let text = r.to_annotated_toml().expect("toml");
    let back: Config = toml::from_str(&text).expect("valid");
    assert!(back.prices.is_empty() && text.contains("prices"), "{text}");
    // A misspelt part and a price below 0 name the key.
    let check = |text: &str, expected: &[&str]| {
        let path = write(&dir, text);
        let err = resolve_with(&flags_with(&path), &env_of(&[]), None).expect_err(text);
        let msg = format!("{err:#}");
        for e in expected {
            assert!(msg.contains(e), "{e:?} not in {msg}");
        }
    };
    check(
        "[prices.m]\ninput_per_mtok = 1.0\noutput_per_mtok = 1.0\ncached_input_per_mtk = 0.1\n",
        &["prices.m", "cached_input_per_mtk"],
    );
    check(
        "[prices.m]\ninput_per_mtok = -1.0\noutput_per_mtok = 1.0\n",
        &["prices.m.input_per_mtok", "at least 0"],
    );
    check("[prices.m]\ninput_per_mtok = 1.0\n", &["output_per_mtok"]);
}

#[test]
fn annotated_output_round_trips_and_names_sources() {
    let dir = temp_dir("print");
    let path = write(
        &dir,
        "[server]\nport = 9000\n[content_filter]\nphrases = [\"two\\nlines\", \"x\"]\n",
    );
    let mut flags = flags_with(&path);
    flags.set("server.host", "0.0.0.0").expect("host");
    let r = resolve_with(&flags, &env_of(&[("SHOAL_QUEUE", "3")]), None).expect("resolve");
    let text = r.to_annotated_toml().expect("toml");
    assert!(text.contains("host = \"0.0.0.0\"  # --host"), "{text}");
    assert!(text.contains("queue = 3  # env SHOAL_QUEUE"), "{text}");
    assert!(
        text.contains(&format!("port = 9000  # config file {}", path.display())),
        "{text}"
    );
    let back: Config = toml::from_str(&text).expect("output is a valid config");
    let mut effective = r.config.server.clone();
    effective.db = r.config.db_path().ok();
    assert_eq!(back.server, effective, "the default store path is shown");
    assert_eq!(back.content_filter, r.config.content_filter);
    assert_eq!(back.model.id.as_deref(), Some(r.config.model_id().as_str()));
}
