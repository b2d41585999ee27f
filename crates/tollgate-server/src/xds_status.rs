//! What the xDS subscription ([`crate::xds`]) has done, held in the service state for
//! `/readyz`, `/healthcheck` and `/metrics` (apart from the subscription, so the state does not
//! depend on it).

use crate::exposition::{Exposition, Kind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// What the subscription has done, for `/readyz` and `/metrics`.
#[derive(Debug, Default)]
pub struct XdsStatus {
    server: String,
    force_start: bool,
    pub(crate) connected: AtomicBool,
    pub(crate) has_config: AtomicBool,
    pub(crate) version: Mutex<String>,
    pub(crate) applied: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) streams: AtomicU64,
}

impl XdsStatus {
    pub(crate) fn new(server: String, force_start: bool) -> Self {
        Self {
            server,
            force_start,
            ..Self::default()
        }
    }

    /// Whether the service may take traffic: once a configuration has arrived, or at once with
    /// `force_start`.
    pub fn ready(&self) -> bool {
        self.force_start || self.has_config.load(Relaxed)
    }

    /// Whether a configuration has been applied.
    pub fn has_config(&self) -> bool {
        self.has_config.load(Relaxed)
    }

    /// Whether the stream is open.
    pub fn connected(&self) -> bool {
        self.connected.load(Relaxed)
    }

    /// The version last applied (empty before the first).
    pub fn version(&self) -> String {
        self.version
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The management server's address.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Append the subscription's metrics to a Prometheus page.
    pub fn expose(&self, out: &mut Exposition) {
        out.single(
            "tollgate_xds_connected",
            Kind::Gauge,
            "Whether the stream to the xDS server is open.",
            u8::from(self.connected()),
        );
        out.single(
            "tollgate_xds_config_received",
            Kind::Gauge,
            "Whether rules have arrived from the xDS server.",
            u8::from(self.has_config()),
        );
        out.family(
            "tollgate_xds_config_info",
            Kind::Gauge,
            "The version of the rules applied from the xDS server.",
        )
        .sample(&[("version", &self.version())], 1);
        out.family(
            "tollgate_xds_updates_total",
            Kind::Counter,
            "xDS responses applied (ACKed) and rejected (NACKed).",
        )
        .sample(&[("result", "applied")], self.applied.load(Relaxed))
        .sample(&[("result", "rejected")], self.rejected.load(Relaxed));
        out.single(
            "tollgate_xds_streams_total",
            Kind::Counter,
            "Streams opened to the xDS server.",
            self.streams.load(Relaxed),
        );
    }
}
