//! OpenTelemetry traces of decisions: a server span per decision (gRPC `ShouldRateLimit`, the
//! HTTP check, forward-auth), joined to the caller's trace by the W3C `traceparent` and
//! `tracestate` headers (gRPC metadata is HTTP/2 headers), with the store call as its child.
//!
//! Off unless the binary builds a [`Tracing`] (an OTLP endpoint is configured): every hook here
//! starts with `state.tracing()`, one load and a branch, and does nothing more when it is `None`.
//!
//! The transports open the span (`Tracing::start`) and make it the current context while the
//! decision runs (attached around a synchronous answer, `in_context` around an awaited one);
//! the decision itself (`crate::check`) adds what only it knows through the current context:
//! the outcome and the rule that decided (`decided`) and the store call (`StoreTimer`). The
//! span ends when the transport drops its context, once the answer is made.
//!
//! Spans leave through `BoundedExport`: a queue of `QUEUE_SPANS` spans and one task that
//! exports what is queued. A span that finds the queue full is dropped and counted; an export
//! that fails (a collector down or slow past the exporter's timeout) is counted too
//! (`tollgate_trace_spans_{exported,dropped,failed}_total`). A decision never waits for the
//! collector.
//!
//! What the spans say (attributes): `tollgate.domain`, `tollgate.outcome` (`OK`, `OVER_LIMIT`
//! or `error`, with `tollgate.error` the error code), `tollgate.rule` (the id of the rule that
//! denied, else of the first rule that matched), `tollgate.descriptors` (how many). Descriptor
//! values name clients (API keys, addresses): they are added (`tollgate.descriptor_values`)
//! only when the operator asks (`--trace-descriptor-values`).

use crate::error::ApiError;
use crate::model::{CheckRequest, CheckResponse, Code};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, StringValue, Value};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Spans waiting for export, at most; one more is dropped (and counted).
pub const QUEUE_SPANS: usize = 2048;

/// Spans sent in one export request, at most.
const BATCH_SPANS: usize = 512;

/// The name of the span of a gRPC `ShouldRateLimit` call (the RPC semantic conventions' name).
pub(crate) const RLS_SPAN: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The name of the span of `POST /v1/check` (and envoy's `POST /json`).
pub(crate) const CHECK_SPAN: &str = "POST /v1/check";
/// The name of the span of envoy's `POST /json` (under `--profile envoy`).
pub(crate) const JSON_SPAN: &str = "POST /json";
/// The name of the span of a forward-auth check.
pub(crate) const FORWARD_AUTH_SPAN: &str = "forward-auth";

/// How spans are made, besides where they go.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TraceSettings {
    /// Which traces are recorded (a caller's sampled flag is followed: parent-based).
    pub sampler: Sampler,
    /// The process as the collector shows it (`service.name` and the rest).
    pub resource: Resource,
    /// Add the descriptors' values to the spans (`--trace-descriptor-values`).
    pub descriptor_values: bool,
}

impl TraceSettings {
    /// Settings with this sampler and resource, no descriptor values.
    pub fn new(sampler: Sampler, resource: Resource) -> Self {
        Self {
            sampler,
            resource,
            descriptor_values: false,
        }
    }
}

/// What became of the spans: exported, dropped at a full queue, lost in a failed export.
#[derive(Debug, Default)]
pub struct SpanCounters {
    exported: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
}

impl SpanCounters {
    /// Spans the collector accepted.
    pub fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }
    /// Spans dropped because the export queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
    /// Spans in export requests that failed.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// The tracer of the decisions, held in the state when traces are on.
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    descriptor_values: bool,
    counters: Arc<SpanCounters>,
    stop: Arc<StopExport>,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing")
            .field("descriptor_values", &self.descriptor_values)
            .finish_non_exhaustive()
    }
}

impl Tracing {
    /// Spans made under `settings`, exported by `exporter` from a task of the current tokio
    /// runtime (so this is called inside one). The exporter is given the resource here.
    pub fn new<E: SpanExporter + 'static>(mut exporter: E, settings: TraceSettings) -> Self {
        exporter.set_resource(&settings.resource);
        let counters = Arc::new(SpanCounters::default());
        let processor = BoundedExport::start(exporter, QUEUE_SPANS, Arc::clone(&counters));
        let stop = Arc::clone(&processor.stop);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(settings.sampler)
            .with_resource(settings.resource)
            .build();
        let tracer = provider.tracer("tollgate");
        Self {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
            descriptor_values: settings.descriptor_values,
            counters,
            stop,
        }
    }

    /// What became of the spans so far.
    pub fn counters(&self) -> &SpanCounters {
        &self.counters
    }

    /// A server span named `name`, a child of the caller's span when `headers` carry a valid
    /// `traceparent`, as the context the decision runs in.
    pub(crate) fn start(&self, name: &'static str, headers: &axum::http::HeaderMap) -> Context {
        let parent = self
            .propagator
            .extract_with_context(&Context::new(), &HeaderExtractor(headers));
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .start_with_context(&self.tracer, &parent);
        parent.with_span(span)
    }

    /// Stop exporting: what is queued is sent within `timeout` (at most), then the task ends.
    pub async fn shutdown(&self, timeout: Duration) {
        self.stop.stop(timeout).await;
        let _ = self.provider.shutdown_with_timeout(timeout);
    }

    /// The span counters' families on `/metrics`.
    pub fn expose(&self, out: &mut crate::exposition::Exposition) {
        let c = &self.counters;
        for (name, help, value) in [
            (
                "tollgate_trace_spans_exported_total",
                "Spans the OTLP collector accepted.",
                c.exported(),
            ),
            (
                "tollgate_trace_spans_dropped_total",
                "Spans dropped because the export queue was full (a collector slower than the decisions, or down).",
                c.dropped(),
            ),
            (
                "tollgate_trace_spans_failed_total",
                "Spans in OTLP export requests that failed.",
                c.failed(),
            ),
        ] {
            out.single(name, crate::exposition::Kind::Counter, help, value);
        }
    }
}

/// `traceparent` and `tracestate` read from request headers (HTTP, or gRPC metadata).
struct HeaderExtractor<'a>(&'a axum::http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(axum::http::HeaderName::as_str).collect()
    }
}

/// The trace headers of `headers` (`traceparent`, `tracestate`) when traces are on, to start
/// a span with once the request's body is read; empty (no allocation) when off.
pub(crate) fn trace_headers(
    tracing: Option<&Tracing>,
    headers: &axum::http::HeaderMap,
) -> axum::http::HeaderMap {
    let mut kept = axum::http::HeaderMap::new();
    if tracing.is_some() {
        for name in ["traceparent", "tracestate"] {
            if let Some(v) = headers.get(name) {
                kept.insert(name, v.clone());
            }
        }
    }
    kept
}

/// `call` with `cx` as the current context whenever it is polled (`None`: `call` as it is).
pub(crate) async fn in_context<T>(cx: Option<Context>, call: impl Future<Output = T>) -> T {
    use opentelemetry::context::FutureExt as _;
    match cx {
        None => call.await,
        Some(cx) => call.with_context(cx).await,
    }
}

/// The decision's outcome on the current span (the one its transport opened).
pub(crate) fn decided(
    tracing: &Tracing,
    req: &CheckRequest,
    result: Result<&CheckResponse, &ApiError>,
) {
    Context::map_current(|cx| {
        let span = cx.span();
        if !span.is_recording() {
            return;
        }
        let mut attributes = vec![
            KeyValue::new("tollgate.domain", req.domain.clone()),
            KeyValue::new("tollgate.descriptors", req.descriptors.len() as i64),
            KeyValue::new("tollgate.hits", req.hits.unwrap_or(1) as i64),
        ];
        match result {
            Ok(answer) => {
                attributes.push(KeyValue::new("tollgate.outcome", answer.code().as_str()));
                let rule = answer
                    .statuses
                    .iter()
                    .find(|s| s.code == Code::OverLimit && s.limit.is_some())
                    .or_else(|| answer.statuses.iter().find(|s| s.limit.is_some()))
                    .and_then(|s| s.limit.as_ref());
                if let Some(limit) = rule {
                    attributes.push(KeyValue::new("tollgate.rule", limit.id.clone()));
                    if let Some(name) = &limit.name {
                        attributes.push(KeyValue::new("tollgate.rule_name", name.clone()));
                    }
                }
            }
            Err(e) => {
                attributes.push(KeyValue::new("tollgate.outcome", "error"));
                attributes.push(KeyValue::new("tollgate.error", e.code()));
                span.set_status(Status::error(e.code()));
            }
        }
        if tracing.descriptor_values {
            let values: Vec<StringValue> = req
                .descriptors
                .iter()
                .map(|d| {
                    let entries: Vec<String> =
                        d.entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    StringValue::from(entries.join(","))
                })
                .collect();
            attributes.push(KeyValue::new(
                "tollgate.descriptor_values",
                Value::Array(values.into()),
            ));
        }
        span.set_attributes(attributes);
    });
}

/// The start of a store call, when it is traced (traces on and a span current).
pub(crate) struct StoreTimer(SystemTime);

impl StoreTimer {
    /// `Some` when the store call about to be made is traced.
    pub(crate) fn start(tracing: Option<&Tracing>) -> Option<Self> {
        tracing?;
        Context::map_current(|cx| cx.span().is_recording()).then(|| Self(SystemTime::now()))
    }

    /// The store call as a child span of the current one, from its start to now.
    pub(crate) fn end<T, E: std::fmt::Display>(
        self,
        tracing: &Tracing,
        store: &'static str,
        items: usize,
        outcome: &Result<T, E>,
    ) {
        let cx = Context::current();
        let mut span = tracing
            .tracer
            .span_builder("store.check")
            .with_kind(SpanKind::Client)
            .with_start_time(self.0)
            .with_attributes([
                KeyValue::new("tollgate.store", store),
                KeyValue::new("tollgate.store.counters", items as i64),
            ])
            .start_with_context(&tracing.tracer, &cx);
        if store != "memory" {
            span.set_attribute(KeyValue::new("db.system.name", "redis"));
        }
        if let Err(e) = outcome {
            span.set_status(Status::error(e.to_string()));
        }
        span.end();
    }
}

/// The span processor: ended spans go into a bounded queue (a full queue drops the span and
/// counts it), and one task exports what is queued, a batch at a time. Decisions never wait
/// for an export.
#[derive(Debug)]
struct BoundedExport {
    queue: tokio::sync::mpsc::Sender<SpanData>,
    counters: Arc<SpanCounters>,
    stop: Arc<StopExport>,
}

/// Stops the export task: `closing` tells it to send what is queued and end; `done` says it
/// has.
#[derive(Debug)]
struct StopExport {
    closing: tokio::sync::watch::Sender<bool>,
    done: tokio::sync::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

impl StopExport {
    /// Tell the task to finish, and wait for it at most `timeout`.
    async fn stop(&self, timeout: Duration) {
        let _ = self.closing.send(true);
        if let Some(done) = self.done.lock().await.take() {
            let _ = tokio::time::timeout(timeout, done).await;
        }
    }
}

impl BoundedExport {
    /// The processor, its export task spawned on the current runtime.
    fn start<E: SpanExporter + 'static>(
        exporter: E,
        capacity: usize,
        counters: Arc<SpanCounters>,
    ) -> Self {
        let (queue, mut spans) = tokio::sync::mpsc::channel::<SpanData>(capacity);
        let (closing, mut closed) = tokio::sync::watch::channel(false);
        let (finished, done) = tokio::sync::oneshot::channel();
        let count = Arc::clone(&counters);
        tokio::spawn(async move {
            let mut exporter = exporter;
            let mut batch = Vec::with_capacity(BATCH_SPANS);
            loop {
                let n = tokio::select! {
                    n = spans.recv_many(&mut batch, BATCH_SPANS) => Some(n),
                    closing = closed.wait_for(|c| *c) => {
                        drop(closing);
                        None
                    }
                };
                let Some(n) = n else {
                    // Shutting down: what is queued now, then stop.
                    while let Ok(span) = spans.try_recv() {
                        batch.push(span);
                    }
                    if !batch.is_empty() {
                        export(&exporter, std::mem::take(&mut batch), &count).await;
                    }
                    break;
                };
                if n == 0 {
                    break;
                }
                export(&exporter, std::mem::take(&mut batch), &count).await;
                batch.reserve(BATCH_SPANS);
            }
            let _ = exporter.shutdown();
            let _ = finished.send(());
        });
        Self {
            queue,
            counters,
            stop: Arc::new(StopExport {
                closing,
                done: tokio::sync::Mutex::new(Some(done)),
            }),
        }
    }
}

/// One export request, counted.
async fn export<E: SpanExporter>(exporter: &E, batch: Vec<SpanData>, counters: &SpanCounters) {
    let n = batch.len() as u64;
    match exporter.export(batch).await {
        Ok(()) => counters.exported.fetch_add(n, Ordering::Relaxed),
        Err(e) => {
            tracing::debug!(error = %e, spans = n, "OTLP export failed");
            counters.failed.fetch_add(n, Ordering::Relaxed)
        }
    };
}

impl SpanProcessor for BoundedExport {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.queue.try_send(span).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    /// Tells the export task to finish without waiting for it (this is called from the
    /// runtime's threads): [`Tracing::shutdown`] is what waits.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        let _ = self.stop.closing.send(true);
        Ok(())
    }
}
