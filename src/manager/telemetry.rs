//! Logging: structured tracing, levels from `RUST_LOG` (default `info`),
//! human-readable on a terminal and one JSON object per line otherwise.
//!
//! The JSON lines are flat: the event's fields and the fields of every span it
//! runs in sit at the top level next to `timestamp`, `level`, `target` and
//! `message`. The stock JSON formatter nests the current span under `span` and
//! writes the span's own name as `name` after its fields, which would hide the
//! `name` field of a reconcile span (the object's name). Flat fields make
//! `namespace` and `name` of the reconciled object a plain filter in any log
//! pipeline.

use std::fmt;
use std::io::IsTerminal;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// Installs the global subscriber, writing to standard error. A second call
/// (tests) keeps the first subscriber.
pub fn init() {
    let json = !std::io::stderr().is_terminal();
    let _ = try_init_with(json, filter_from_env(), std::io::stderr);
}

/// `RUST_LOG`, or `info` when unset or unparsable (an unparsable value is
/// reported once the subscriber is up, not silently ignored).
fn filter_from_env() -> EnvFilter {
    match EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(e) => {
            if std::env::var_os(EnvFilter::DEFAULT_ENV).is_some() {
                eprintln!("ignoring RUST_LOG ({e}); logging at info");
            }
            EnvFilter::new("info")
        }
    }
}

fn try_init_with<W>(
    json: bool,
    filter: EnvFilter,
    writer: W,
) -> Result<(), tracing_subscriber::util::TryInitError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::util::SubscriberInitExt;
    if json {
        subscriber_json(filter, writer).try_init()
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(writer)
            .finish()
            .try_init()
    }
}

/// The JSON subscriber, separate so tests can capture its output.
pub fn subscriber_json<W>(filter: EnvFilter, writer: W) -> impl Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .fmt_fields(JsonFields::new())
        .event_format(FlatJson)
        .finish()
}

/// One JSON object per event with span fields flattened in (see the module docs).
pub struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            Value::String(k8s_openapi::jiff::Timestamp::now().to_string()),
        );
        line.insert("level".into(), Value::String(meta.level().to_string()));
        line.insert("target".into(), Value::String(meta.target().to_owned()));

        // Outermost span first, so an inner span's field wins over an outer one's.
        let mut span_names = Vec::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                span_names.push(Value::String(span.name().to_owned()));
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else {
                    continue;
                };
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields) {
                    line.extend(fields);
                }
            }
        }
        if !span_names.is_empty() {
            line.insert("spans".into(), Value::Array(span_names));
        }

        // The event's own fields win over span fields of the same name.
        let mut visitor = JsonVisitor(Map::new());
        event.record(&mut visitor);
        line.extend(visitor.0);

        let text = serde_json::to_string(&Value::Object(line)).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// Collects an event's fields as JSON values.
struct JsonVisitor(Map<String, Value>);

impl Visit for JsonVisitor {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let value = serde_json::Number::from_f64(value)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(value.to_string()));
        self.0.insert(field.name().to_owned(), value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::{Instrument, info, info_span};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    fn lines(buffer: &Buffer) -> Vec<Value> {
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[tokio::test]
    async fn reconcile_lines_carry_namespace_and_name_at_the_top_level() {
        let buffer = Buffer::default();
        let subscriber = subscriber_json(EnvFilter::new("debug"), buffer.clone());
        let _guard = tracing::subscriber::set_default(subscriber);
        async {
            info!(checksum = "abc", replicas = 2u64, "applying Deployment");
        }
        .instrument(info_span!(
            "reconcile",
            controller = "haltsqlserver",
            namespace = "agents",
            name = "haltsql"
        ))
        .await;
        info!("outside any span");

        let lines = lines(&buffer);
        assert_eq!(lines.len(), 2, "{lines:?}");
        let line = &lines[0];
        assert_eq!(line["namespace"], "agents");
        assert_eq!(
            line["name"], "haltsql",
            "the span's own name must not hide it"
        );
        assert_eq!(line["controller"], "haltsqlserver");
        assert_eq!(line["message"], "applying Deployment");
        assert_eq!(line["checksum"], "abc");
        assert_eq!(line["replicas"], 2);
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["spans"], serde_json::json!(["reconcile"]));
        assert!(line["timestamp"].as_str().unwrap().ends_with('Z'));
        assert!(lines[1].get("namespace").is_none());
        assert!(lines[1].get("spans").is_none());
    }

    #[test]
    fn the_filter_drops_debug_at_info() {
        let buffer = Buffer::default();
        let subscriber = subscriber_json(EnvFilter::new("info"), buffer.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!("conflict, requeueing");
            tracing::warn!(error = "boom", "reconcile failed");
        });
        let lines = lines(&buffer);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0]["level"], "WARN");
        assert_eq!(lines[0]["error"], "boom");
    }
}
