//! Shoal as a desktop app: the engine and the HTTP API run in this process,
//! the chat window shows the UI the server itself serves, and a tray (menu
//! bar) item shows the server's state and starts, stops and quits it.
//! Closing the window leaves the server and the tray running.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

mod server;
mod tray;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use tauri::webview::PageLoadEvent;
use tauri::{AppHandle, Manager, RunEvent, WebviewUrl, WebviewWindowBuilder};

use crate::server::Server;

/// Label of the chat window.
const WINDOW: &str = "main";

#[derive(Parser, Debug)]
#[command(
    name = "shoal-desktop",
    version,
    about = "Shoal desktop app: the API server with a chat window and a tray menu"
)]
struct Cli {
    /// The same settings as `shoal serve` (config file, environment, flags).
    #[command(flatten)]
    settings: shoal::config::Flags,
    /// Start with the tray (menu bar) item only: no chat window until "Open
    /// Chat", and on macOS no Dock icon.
    #[arg(long, env = "SHOAL_MENU_BAR_ONLY")]
    menu_bar_only: bool,
}

/// `shoal-desktop shard …`: a node's server starts pipeline shards as its
/// own executable, so the app hosts a share of a split model just as the
/// `shoal` binary does.
#[derive(Parser, Debug)]
#[command(name = "shoal-desktop shard")]
struct ShardCli {
    #[command(flatten)]
    args: shoal::shard::Args,
}

/// Shared by the menu handlers.
pub struct Shell {
    pub server: Server,
    /// Set once Quit has begun, so the exit it requests is let through.
    quitting: AtomicBool,
}

fn main() -> Result<()> {
    shoal::init_logging(shoal::LogFormat::Text);
    if std::env::args_os().nth(1).is_some_and(|a| a == "shard") {
        return shoal::shard::run(ShardCli::parse_from(std::env::args_os().skip(1)).args);
    }
    // WebKitGTK's WebDriver launches the app with `--automation`; it is
    // handled by the webview, not by us.
    let cli = Cli::parse_from(std::env::args_os().filter(|a| a != "--automation"));
    let resolved = shoal::config::resolve(&cli.settings)?;
    if let Some(file) = &resolved.file {
        tracing::info!(file = %file.display(), "config file");
    }

    // One tokio runtime for the server and for Tauri's async tasks.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("shoal-rt")
        .build()
        .context("starting the async runtime")?;
    tauri::async_runtime::set(runtime.handle().clone());

    let shell = Arc::new(Shell {
        server: Server::new(resolved.config),
        quitting: AtomicBool::new(false),
    });
    let menu_bar_only = cli.menu_bar_only;
    let app = tauri::Builder::default()
        .plugin(tauri_plugin_clipboard_manager::init())
        .manage(shell.clone())
        .setup(move |app| {
            #[cfg(target_os = "macos")]
            if menu_bar_only {
                app.set_activation_policy(tauri::ActivationPolicy::Accessory);
            }
            tray::build(app.handle())?;
            if !menu_bar_only {
                open_chat(app.handle());
            }
            boot(app.handle().clone());
            catch_signals(app.handle().clone());
            Ok(())
        })
        .build(tauri::generate_context!())
        .context("starting the app")?;
    app.run(move |app, event| match event {
        // The last window closed: keep serving from the tray.
        RunEvent::ExitRequested { api, code, .. } => {
            if code.is_none() && !shell.quitting.load(Ordering::SeqCst) {
                api.prevent_exit();
            }
        }
        #[cfg(target_os = "macos")]
        RunEvent::Reopen { .. } => open_chat(app),
        _ => {
            let _ = app;
        }
    });
    Ok(())
}

/// Loads the model off the UI thread, then starts the server and points the
/// chat window at it.
fn boot(app: AppHandle) {
    tauri::async_runtime::spawn(async move {
        let shell = app.state::<Arc<Shell>>().inner().clone();
        let server = shell.server.clone();
        let loaded = tokio::task::spawn_blocking(move || server.load()).await;
        match loaded {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let message = format!("{e:#}");
                tracing::error!(error = message, "could not load the model");
                if let Some(window) = app.get_webview_window(WINDOW) {
                    show_error(&window, &message);
                }
                tray::refresh(&app);
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, "model loading panicked");
                return;
            }
        }
        start_server(&app).await;
    });
}

/// Starts the server and shows the chat in the window, if one is open.
pub async fn start_server(app: &AppHandle) {
    let shell = app.state::<Arc<Shell>>().inner().clone();
    match shell.server.start().await {
        Ok(url) => {
            // Scripts and tests wait for this line, as with `shoal serve`.
            println!("shoal listening on {url}");
            if let Some(window) = app.get_webview_window(WINDOW) {
                navigate(&window, &url);
            }
        }
        Err(e) => tracing::error!(error = format!("{e:#}"), "could not start the server"),
    }
    tray::refresh(app);
}

/// Puts a model-loading failure on the loading page (the window has
/// nothing else to show).
fn show_error(window: &tauri::WebviewWindow, message: &str) {
    let Ok(text) = serde_json::to_string(&format!("Shoal could not load the model: {message}"))
    else {
        return;
    };
    let script = format!(
        "{{ const p = document.querySelector('[data-testid=desktop-loading]'); if (p) p.textContent = {text}; }}"
    );
    if let Err(e) = window.eval(script) {
        tracing::warn!(error = %e, "could not show the error in the window");
    }
}

fn navigate(window: &tauri::WebviewWindow, url: &str) {
    match url.parse() {
        Ok(u) => {
            if let Err(e) = window.navigate(u) {
                tracing::warn!(error = %e, "could not load the chat");
            }
        }
        Err(e) => tracing::warn!(error = %e, url, "bad server URL"),
    }
}

/// Shows the chat window, creating it if it was closed.
pub fn open_chat(app: &AppHandle) {
    if let Some(window) = app.get_webview_window(WINDOW) {
        let _ = window.unminimize();
        let _ = window.show();
        let _ = window.set_focus();
        return;
    }
    let shell = app.state::<Arc<Shell>>();
    let url = match (&shell.server.status(), shell.server.url()) {
        (server::Status::Serving { .. }, Some(url)) => url.parse().ok().map(WebviewUrl::External),
        _ => None,
    };
    let url = url.unwrap_or_else(|| WebviewUrl::App("index.html".into()));
    let built = WebviewWindowBuilder::new(app, WINDOW, url)
        .title("Shoal")
        .inner_size(960.0, 760.0)
        .min_inner_size(420.0, 420.0)
        .on_page_load(|window, load| {
            // The loading page, once loaded, shows a failure that came first.
            if load.event() == PageLoadEvent::Finished {
                let shell = window.state::<Arc<Shell>>();
                if let server::Status::Failed(e) = shell.server.status() {
                    show_error(&window, &e);
                }
            }
        })
        .build();
    if let Err(e) = built {
        tracing::error!(error = %e, "could not open the chat window");
    }
}

/// Quit: stop accepting, let open responses finish (bounded), then exit.
pub fn quit(app: &AppHandle) {
    let shell = app.state::<Arc<Shell>>().inner().clone();
    if shell.quitting.swap(true, Ordering::SeqCst) {
        return;
    }
    let app = app.clone();
    tauri::async_runtime::spawn(async move {
        tracing::info!("quitting");
        shell.server.stop().await;
        shell.server.free_models().await;
        app.exit(0);
    });
}

/// SIGINT and SIGTERM quit the same way as the menu.
fn catch_signals(app: AppHandle) {
    tauri::async_runtime::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut term) = signal(SignalKind::terminate()) else {
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                return;
            }
        }
        quit(&app);
    });
}
