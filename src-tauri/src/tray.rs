//! The tray (menu bar) item: a status line, the Ollama port's and the MCP
//! servers', then
//! Open Chat, Start/Stop Server, Copy API URL and Quit.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tauri::menu::{Menu, MenuEvent, MenuItem, PredefinedMenuItem};
use tauri::tray::TrayIconBuilder;
use tauri::{AppHandle, Manager, Wry};
use tauri_plugin_clipboard_manager::ClipboardExt;

use crate::server::Status;
use crate::Shell;

const TRAY: &str = "shoal";
const STATUS: &str = "status";
const OLLAMA: &str = "ollama";
const MCP: &str = "mcp";
const OPEN: &str = "open";
const TOGGLE: &str = "toggle";
const COPY: &str = "copy";
const QUIT: &str = "quit";

/// The items whose text or state changes, and what they show now.
struct Items {
    status: MenuItem<Wry>,
    ollama: MenuItem<Wry>,
    mcp: MenuItem<Wry>,
    toggle: MenuItem<Wry>,
    copy: MenuItem<Wry>,
    shown: Mutex<Option<Shown>>,
}

#[derive(Clone, PartialEq, Eq)]
struct Shown {
    line: String,
    ollama: String,
    mcp: String,
    toggle: &'static str,
    can_toggle: bool,
    can_copy: bool,
}

pub fn build(app: &AppHandle) -> tauri::Result<()> {
    let status = MenuItem::with_id(app, STATUS, Status::Loading.line(), false, None::<&str>)?;
    let ollama = MenuItem::with_id(app, OLLAMA, "Ollama API: …", false, None::<&str>)?;
    let mcp = MenuItem::with_id(app, MCP, "MCP: …", false, None::<&str>)?;
    let open = MenuItem::with_id(app, OPEN, "Open Chat", true, None::<&str>)?;
    let toggle = MenuItem::with_id(app, TOGGLE, "Stop Server", false, None::<&str>)?;
    let copy = MenuItem::with_id(app, COPY, "Copy API URL", false, None::<&str>)?;
    let quit = MenuItem::with_id(app, QUIT, "Quit Shoal", true, None::<&str>)?;
    let menu = Menu::with_items(
        app,
        &[
            &status,
            &ollama,
            &mcp,
            &PredefinedMenuItem::separator(app)?,
            &open,
            &toggle,
            &copy,
            &PredefinedMenuItem::separator(app)?,
            &quit,
        ],
    )?;
    let mut tray = TrayIconBuilder::with_id(TRAY)
        .tooltip("Shoal")
        .menu(&menu)
        .show_menu_on_left_click(true)
        .on_menu_event(on_menu);
    if let Some(icon) = app.default_window_icon() {
        tray = tray.icon(icon.clone());
    }
    tray.build(app)?;
    app.manage(Items {
        status,
        ollama,
        mcp,
        toggle,
        copy,
        shown: Mutex::new(None),
    });
    // Requests come and go without telling the tray; poll the counters.
    let app = app.clone();
    tauri::async_runtime::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            refresh(&app);
        }
    });
    Ok(())
}

/// Brings the menu in line with the server's state.
pub fn refresh(app: &AppHandle) {
    let shell = app.state::<Arc<Shell>>();
    let Some(items) = app.try_state::<Items>() else {
        return;
    };
    let status = shell.server.status();
    let (toggle, can_toggle) = match status {
        Status::Serving { .. } => ("Stop Server", true),
        Status::Stopped { .. } => ("Start Server", true),
        Status::Loading | Status::Failed(_) => ("Start Server", false),
    };
    let now = Shown {
        line: status.line(),
        ollama: shell
            .server
            .ollama_line()
            .unwrap_or_else(|| "Ollama API: …".to_string()),
        mcp: shell
            .server
            .mcp_line()
            .unwrap_or_else(|| "MCP: …".to_string()),
        toggle,
        can_toggle,
        can_copy: shell.server.url().is_some(),
    };
    let mut shown = items.shown.lock().unwrap_or_else(|e| e.into_inner());
    let before = shown.replace(now.clone());
    if before.as_ref() == Some(&now) {
        return;
    }
    if before.as_ref().map(|b| &b.line) != Some(&now.line) {
        let _ = items.status.set_text(&now.line);
        if let Some(tray) = app.tray_by_id(TRAY) {
            let _ = tray.set_tooltip(Some(format!("Shoal — {}", now.line)));
        }
    }
    if before.as_ref().map(|b| &b.ollama) != Some(&now.ollama) {
        let _ = items.ollama.set_text(&now.ollama);
    }
    if before.as_ref().map(|b| &b.mcp) != Some(&now.mcp) {
        let _ = items.mcp.set_text(&now.mcp);
    }
    let _ = items.toggle.set_text(now.toggle);
    let _ = items.toggle.set_enabled(now.can_toggle);
    let _ = items.copy.set_enabled(now.can_copy);
}

fn on_menu(app: &AppHandle, event: MenuEvent) {
    match event.id().as_ref() {
        OPEN => crate::open_chat(app),
        TOGGLE => {
            let app = app.clone();
            tauri::async_runtime::spawn(async move {
                let shell = app.state::<Arc<Shell>>().inner().clone();
                match shell.server.status() {
                    Status::Serving { .. } => {
                        shell.server.stop().await;
                        refresh(&app);
                    }
                    Status::Stopped { .. } => crate::start_server(&app).await,
                    Status::Loading | Status::Failed(_) => {}
                }
            });
        }
        COPY => {
            let shell = app.state::<Arc<Shell>>();
            if let Some(url) = shell.server.url() {
                // SDKs take the `/v1` base (Anthropic's also accept the root).
                let api = format!("{url}v1");
                match app.clipboard().write_text(api.clone()) {
                    Ok(()) => tracing::info!(url = api, "API URL copied"),
                    Err(e) => tracing::warn!(error = %e, "could not copy the API URL"),
                }
            }
        }
        QUIT => crate::quit(app),
        other => tracing::debug!(id = other, "unknown menu item"),
    }
}
