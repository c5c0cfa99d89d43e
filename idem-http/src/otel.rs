//! OpenTelemetry, through the `tracing-opentelemetry` bridge (feature
//! `otel`): the span context a first execution keeps when its request
//! brought none, and the link a replay's span gets. Without the feature
//! both do nothing, so the exchange reads the same either way.

use crate::TraceParent;

/// The OpenTelemetry span context of the current span, when an
/// OpenTelemetry layer is installed and gave it a valid one.
#[cfg(feature = "otel")]
pub(crate) fn current() -> Option<TraceParent> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    // No subscriber wants any span, so no OpenTelemetry layer made one.
    if !crate::exchange::may_trace(tracing::Level::ERROR) {
        return None;
    }
    let context = tracing::Span::current().context();
    let span = context.span();
    let current = span.span_context();
    if !current.is_valid() {
        return None;
    }
    TraceParent::new(
        current.trace_id().to_bytes(),
        current.span_id().to_bytes(),
        current.trace_flags().to_u8(),
    )
}

/// Links `span` to the span `original` names.
#[cfg(feature = "otel")]
pub(crate) fn link(span: &tracing::Span, original: TraceParent) {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    span.add_link(SpanContext::new(
        TraceId::from_bytes(original.trace_id()),
        SpanId::from_bytes(original.span_id()),
        TraceFlags::new(original.flags()),
        // The original request's span belongs to another, finished trace.
        true,
        TraceState::default(),
    ));
}

#[cfg(not(feature = "otel"))]
pub(crate) fn current() -> Option<TraceParent> {
    None
}

#[cfg(not(feature = "otel"))]
pub(crate) fn link(_: &tracing::Span, _: TraceParent) {}
