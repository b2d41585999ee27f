//! `serve`'s traces: its flags, the standard `OTEL_*` variables and, under `--profile envoy`,
//! envoyproxy/ratelimit's `TRACING_*` settings resolved into one [`TracePlan`] before the
//! service starts (a bad value stops the start with a clear error), and the plan built into an
//! OTLP exporter (gRPC or http/protobuf) and the service's [`Tracing`] once the runtime runs.
//! The spans themselves are made in `tollgate_server::otel`.

use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{RandomIdGenerator, Sampler};
use opentelemetry_sdk::Resource;
use tollgate_server::envoy::profile::EnvoyTracing;
use tollgate_server::otel::{TraceSettings, Tracing};

/// The longest endpoint URL taken.
const MAX_ENDPOINT: usize = 2048;

/// `serve`'s tracing flags; each also reads a `TOLLGATE_*` environment variable.
#[derive(Debug, Clone, clap::Args)]
pub struct TraceArgs {
    /// Send a trace span of every sampled decision to this OpenTelemetry (OTLP) collector, e.g.
    /// `http://otel-collector:4318` (http/protobuf; `/v1/traces` is added to a URL with no
    /// path) or `http://otel-collector:4317` (with --otlp-protocol grpc). Traces are off unless
    /// this, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set (or
    /// TRACING_ENABLED under --profile envoy). See docs/tracing.md.
    #[arg(long, env = "TOLLGATE_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// The OTLP protocol: `http/protobuf` or `grpc`. Default: OTEL_EXPORTER_OTLP_PROTOCOL, else
    /// http/protobuf.
    #[arg(
        long,
        env = "TOLLGATE_OTLP_PROTOCOL",
        value_enum,
        value_name = "PROTOCOL"
    )]
    pub otlp_protocol: Option<OtlpProtocol>,
    /// The ratio of decisions traced (0 to 1) when the caller has not decided; a caller's
    /// `traceparent` sampled flag is followed. Default: OTEL_TRACES_SAMPLER(_ARG), else 1.
    #[arg(long, env = "TOLLGATE_TRACE_SAMPLING", value_parser = ratio, value_name = "RATIO")]
    pub trace_sampling: Option<f64>,
    /// The `service.name` of the spans. Default: OTEL_SERVICE_NAME, else `tollgate`.
    #[arg(long, env = "TOLLGATE_TRACE_SERVICE_NAME", value_name = "NAME")]
    pub trace_service_name: Option<String>,
    /// Add the descriptors' values to the spans (`tollgate.descriptor_values`). Off by
    /// default: the values name clients (API keys, addresses, users).
    #[arg(long, env = "TOLLGATE_TRACE_DESCRIPTOR_VALUES")]
    pub trace_descriptor_values: bool,
}

/// How spans reach the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OtlpProtocol {
    /// OTLP over HTTP, protobuf bodies (port 4318 by convention).
    #[value(name = "http/protobuf")]
    HttpProtobuf,
    /// OTLP over gRPC (port 4317 by convention).
    Grpc,
}

impl OtlpProtocol {
    fn name(self) -> &'static str {
        match self {
            OtlpProtocol::HttpProtobuf => "http/protobuf",
            OtlpProtocol::Grpc => "grpc",
        }
    }
}

/// The traces' settings, resolved.
#[derive(Debug, Clone)]
pub struct TracePlan {
    endpoint: String,
    protocol: OtlpProtocol,
    sampler: Sampler,
    /// `None`: the OTEL_* variables name the service.
    service_name: Option<String>,
    service_namespace: Option<String>,
    service_instance_id: Option<String>,
    descriptor_values: bool,
}

/// A sampling ratio, 0 to 1.
fn ratio(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|r| (0.0..=1.0).contains(r))
        .ok_or_else(|| format!("expected a ratio from 0 to 1 (0.01 traces 1 %), not {text:?}"))
}

/// The sampler of a ratio: the caller's decision followed, else this share of traces.
fn parent_based(ratio: f64) -> Sampler {
    let root = if ratio >= 1.0 {
        Sampler::AlwaysOn
    } else if ratio <= 0.0 {
        Sampler::AlwaysOff
    } else {
        Sampler::TraceIdRatioBased(ratio)
    };
    Sampler::ParentBased(Box::new(root))
}

/// Resolve the traces' settings: the flags first, then envoy's `TRACING_*` (under the
/// profile), then the `OTEL_*` variables read through `var`. `None`: traces are off.
pub fn plan(
    args: &TraceArgs,
    envoy: Option<&EnvoyTracing>,
    var: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<TracePlan>> {
    let env = |name: &str| {
        var(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
    let from_env = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
    if args.otlp_endpoint.is_none() && envoy.is_none() && (disabled || !from_env) {
        return Ok(None);
    }
    let protocol = match (args.otlp_protocol, envoy) {
        (Some(p), _) => p,
        (None, Some(e)) if e.grpc => OtlpProtocol::Grpc,
        (None, Some(_)) => OtlpProtocol::HttpProtobuf,
        (None, None) => {
            let named = env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                .map(|v| ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", v))
                .or_else(|| {
                    env("OTEL_EXPORTER_OTLP_PROTOCOL").map(|v| ("OTEL_EXPORTER_OTLP_PROTOCOL", v))
                });
            match named {
                None => OtlpProtocol::HttpProtobuf,
                Some((_, v)) if v == "http/protobuf" => OtlpProtocol::HttpProtobuf,
                Some((_, v)) if v == "grpc" => OtlpProtocol::Grpc,
                Some((name, v)) => anyhow::bail!(
                    "{name}={v:?}: tollgate sends traces with grpc or http/protobuf (http/json \
                     is not supported)"
                ),
            }
        }
    };
    let endpoint = match (
        &args.otlp_endpoint,
        env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    ) {
        (Some(url), _) => endpoint_url("--otlp-endpoint", url, protocol, true)?,
        (None, Some(url)) => {
            endpoint_url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url, protocol, false)?
        }
        (None, None) => match env("OTEL_EXPORTER_OTLP_ENDPOINT") {
            Some(url) => {
                // The variable names the collector; the traces' path is added for HTTP.
                let base = endpoint_url("OTEL_EXPORTER_OTLP_ENDPOINT", &url, protocol, false)?;
                match protocol {
                    OtlpProtocol::HttpProtobuf => {
                        format!("{}/v1/traces", base.trim_end_matches('/'))
                    }
                    OtlpProtocol::Grpc => base,
                }
            }
            None => match protocol {
                OtlpProtocol::HttpProtobuf => "http://localhost:4318/v1/traces".to_owned(),
                OtlpProtocol::Grpc => "http://localhost:4317".to_owned(),
            },
        },
    };
    let sampler = match (args.trace_sampling, envoy) {
        (Some(r), _) => parent_based(r),
        (None, Some(e)) => parent_based(e.sampling_rate),
        (None, None) => otel_sampler(&env)?,
    };
    let service_name = match (&args.trace_service_name, envoy) {
        (Some(n), _) => Some(n.clone()),
        (None, Some(e)) => Some(e.service_name.clone()),
        (None, None) => {
            let named = env("OTEL_SERVICE_NAME").is_some()
                || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="));
            (!named).then(|| "tollgate".to_owned())
        }
    };
    Ok(Some(TracePlan {
        endpoint,
        protocol,
        sampler,
        service_name,
        service_namespace: envoy.and_then(|e| e.service_namespace.clone()),
        // envoyproxy/ratelimit makes up a random id when none is given.
        service_instance_id: envoy.map(|e| {
            e.service_instance_id
                .clone()
                .unwrap_or_else(random_instance_id)
        }),
        descriptor_values: args.trace_descriptor_values,
    }))
}

/// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`; unset: every trace the caller has not
/// declined (`parentbased_always_on`, the standard default).
fn otel_sampler(env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Sampler> {
    let arg = || -> anyhow::Result<f64> {
        match env("OTEL_TRACES_SAMPLER_ARG") {
            None => Ok(1.0),
            Some(v) => ratio(&v).map_err(|e| anyhow::anyhow!("OTEL_TRACES_SAMPLER_ARG: {e}")),
        }
    };
    let Some(name) = env("OTEL_TRACES_SAMPLER") else {
        return Ok(parent_based(1.0));
    };
    Ok(match name.as_str() {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatioBased(arg()?),
        "parentbased_always_on" => parent_based(1.0),
        "parentbased_always_off" => parent_based(0.0),
        "parentbased_traceidratio" => parent_based(arg()?),
        other => anyhow::bail!(
            "OTEL_TRACES_SAMPLER={other:?}: expected always_on, always_off, traceidratio, \
             parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
        ),
    })
}

/// `url` checked (plain `http://`; `host:port` alone means `http://host:port`); with
/// `add_path`, an http/protobuf URL with no path gets the traces' path `/v1/traces`.
fn endpoint_url(
    source: &str,
    url: &str,
    protocol: OtlpProtocol,
    add_path: bool,
) -> anyhow::Result<String> {
    let url = url.trim();
    if url.len() > MAX_ENDPOINT {
        anyhow::bail!("{source}: longer than {MAX_ENDPOINT} bytes");
    }
    let url = if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e| anyhow::anyhow!("{source}={url:?}: not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => anyhow::bail!(
            "{source}={url:?}: TLS to the collector is not supported yet; use http:// (a \
             collector agent on the node, or a sidecar)"
        ),
        _ => anyhow::bail!("{source}={url:?}: expected an http:// URL"),
    }
    if uri.host().is_none() {
        anyhow::bail!("{source}={url:?}: no host");
    }
    let bare = matches!(uri.path(), "" | "/");
    Ok(match protocol {
        OtlpProtocol::HttpProtobuf if add_path && bare => {
            format!("{}/v1/traces", url.trim_end_matches('/'))
        }
        _ => url,
    })
}

/// A random UUID-shaped id (version 4 layout), as envoyproxy/ratelimit's default
/// `service.instance.id`.
fn random_instance_id() -> String {
    use opentelemetry_sdk::trace::IdGenerator as _;
    let hex = format!("{:032x}", RandomIdGenerator::default().new_trace_id());
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

impl TracePlan {
    /// Where and how spans go, for the start-up log.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.endpoint, self.protocol.name())
    }

    /// The exporter and the service's tracer. Called inside the tokio runtime (the exporter's
    /// connection and the export task live there).
    pub fn build(&self) -> anyhow::Result<Tracing> {
        let mut resource = Resource::builder();
        if let Some(name) = &self.service_name {
            resource = resource.with_service_name(name.clone());
        }
        resource =
            resource.with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
        if let Some(ns) = &self.service_namespace {
            resource = resource.with_attribute(KeyValue::new("service.namespace", ns.clone()));
        }
        if let Some(id) = &self.service_instance_id {
            resource = resource.with_attribute(KeyValue::new("service.instance.id", id.clone()));
        }
        let mut settings = TraceSettings::new(self.sampler.clone(), resource.build());
        settings.descriptor_values = self.descriptor_values;
        let built = match self.protocol {
            OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(self.endpoint.clone())
                .build()
                .map(|e| Tracing::new(e, settings)),
            OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(self.endpoint.clone())
                .build()
                .map(|e| Tracing::new(e, settings)),
        };
        built.map_err(|e| {
            anyhow::anyhow!("cannot set up the OTLP exporter to {}: {e}", self.endpoint)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn args() -> TraceArgs {
        TraceArgs {
            otlp_endpoint: None,
            otlp_protocol: None,
            trace_sampling: None,
            trace_service_name: None,
            trace_descriptor_values: false,
        }
    }

    fn with(vars: &[(&str, &str)], a: &TraceArgs) -> anyhow::Result<Option<TracePlan>> {
        let m: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        plan(a, None, &|k| m.get(k).cloned())
    }

    #[test]
    fn off_unless_an_endpoint_is_given() {
        assert!(with(&[], &args()).unwrap().is_none());
        assert!(with(&[("OTEL_SERVICE_NAME", "x")], &args())
            .unwrap()
            .is_none());
        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        assert!(with(&on, &args()).unwrap().is_some());
        let off = [on[0], ("OTEL_SDK_DISABLED", "true")];
        assert!(with(&off, &args()).unwrap().is_none());
        let off = [on[0], ("OTEL_TRACES_EXPORTER", "none")];
        assert!(with(&off, &args()).unwrap().is_none());
    }

    #[test]
    fn endpoints_follow_the_standard() {
        let p = with(
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")],
            &args(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.endpoint, "http://c:4318/v1/traces");
        assert_eq!(p.service_name.as_deref(), Some("tollgate"));
        let p = with(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_SERVICE_NAME", "edge"),
            ],
            &args(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (p.endpoint.as_str(), p.protocol),
            ("http://c:4317", OtlpProtocol::Grpc)
        );
        assert_eq!(p.service_name, None, "the SDK reads OTEL_SERVICE_NAME");
        let p = with(
            &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/custom")],
            &args(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.endpoint, "http://c:4318/custom");
        let mut a = args();
        a.otlp_endpoint = Some("http://c:9999".into());
        assert_eq!(
            with(&[], &a).unwrap().unwrap().endpoint,
            "http://c:9999/v1/traces"
        );
        a.otlp_endpoint = Some("https://c:9999".into());
        assert!(with(&[], &a).unwrap_err().to_string().contains("TLS"));
        a.otlp_endpoint = Some("http://".into());
        assert!(with(&[], &a).is_err());
    }

    #[test]
    fn bad_standard_values_are_refused() {
        let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        for bad in [
            [on, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
            [on, ("OTEL_TRACES_SAMPLER", "sometimes")],
            [on, ("OTEL_TRACES_SAMPLER", "traceidratio")],
        ] {
            let mut vars = bad.to_vec();
            if bad[1].1 == "traceidratio" {
                vars.push(("OTEL_TRACES_SAMPLER_ARG", "2"));
            }
            assert!(with(&vars, &args()).is_err(), "{vars:?}");
        }
        assert!(ratio("0.01").is_ok() && ratio("1.5").is_err() && ratio("x").is_err());
    }

    #[test]
    fn envoy_settings_and_defaults() {
        let e = EnvoyTracing {
            grpc: true,
            service_name: "RateLimit".into(),
            service_namespace: Some("gw".into()),
            service_instance_id: None,
            sampling_rate: 0.5,
        };
        let p = plan(&args(), Some(&e), &|k| {
            (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://collector:4317".to_owned())
        })
        .unwrap()
        .unwrap();
        assert_eq!(p.endpoint, "http://collector:4317");
        assert_eq!(p.protocol, OtlpProtocol::Grpc);
        assert_eq!(p.service_name.as_deref(), Some("RateLimit"));
        let id = p.service_instance_id.unwrap();
        assert_eq!(id.len(), 36, "{id}");
        let p = plan(&args(), Some(&EnvoyTracing { grpc: false, ..e }), &|_| None)
            .unwrap()
            .unwrap();
        assert_eq!(p.endpoint, "http://localhost:4318/v1/traces");
    }
}
