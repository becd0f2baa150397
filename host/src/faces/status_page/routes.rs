//! `/status` (the page), `/status/fragment` (what its script swaps in) and
//! `/status/blocks.json` (the blocks per target, for `kubectl px status`) and
//! `/status/usage.json` (the usage book, for `kubectl px usage`), on the metrics port.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use super::blocks_json::BLOCKS_JSON_PATH;
use super::gather::Sources;
use super::render;
use super::usage_json::USAGE_JSON_PATH;

/// The page's routes over `sources`, to merge into the metrics server's router.
pub fn router(sources: Sources) -> axum::Router {
    let fragment_sources = sources.clone();
    let blocks_sources = sources.clone();
    let usage_sources = sources.clone();
    axum::Router::new()
        .route(
            "/status",
            get(move || {
                let html = render::page(&sources.snapshot());
                async move { html_response(html) }
            }),
        )
        .route(
            "/status/fragment",
            get(move || {
                let html = render::fragment(&fragment_sources.snapshot());
                async move { html_response(html) }
            }),
        )
        .route(
            BLOCKS_JSON_PATH,
            get(move || {
                let blocks = blocks_sources.recent_blocks();
                async move { ([(header::CACHE_CONTROL, "no-store")], axum::Json(blocks)) }
            }),
        )
        .route(
            USAGE_JSON_PATH,
            get(move || {
                let usage = usage_sources.usage_report();
                async move { ([(header::CACHE_CONTROL, "no-store")], axum::Json(usage)) }
            }),
        )
}

fn html_response(html: String) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            // Nothing but the page's own inline style and script, and fetches of its own origin.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        html,
    )
}
