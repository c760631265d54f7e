//! A front end drives a gateway from outside it, through the public peer operations, as the
//! fleet (`tunneld-fleet`) does. It shows its own state through the gateway: in
//! `tunneld show` (the UAPI socket's `fleet=1`) and in `GET /metrics`.

use std::sync::{Arc, Mutex};

/// The state of what drives a gateway from outside, as the gateway shows it.
pub trait FrontEnd: Send + Sync {
    /// The state as `key=value` lines (each ending in `\n`; no empty line, no `errno`), the
    /// reply to the UAPI socket's `fleet=1`.
    fn uapi_status(&self) -> String;
    /// Counters and gauges in Prometheus's text format, HELP and TYPE lines included.
    fn metrics(&self) -> String;
}

/// The front end attached to a gateway, if any; shared by the control (the UAPI socket) and
/// the metrics server.
pub(crate) type FrontEndSlot = Arc<Mutex<Option<Arc<dyn FrontEnd>>>>;

/// The attached front end's status as a UAPI reply (`None`: nothing is attached).
pub(crate) fn uapi_reply(slot: &FrontEndSlot) -> Option<String> {
    // A holder that panicked left the slot whole: an Arc is set or taken in one step.
    let front_end = slot.lock().unwrap_or_else(|p| p.into_inner()).clone()?;
    let mut reply = String::new();
    for line in front_end.uapi_status().lines() {
        // An empty line would end the reply early.
        if !line.is_empty() {
            reply.push_str(line);
            reply.push('\n');
        }
    }
    reply.push_str("errno=0\n\n");
    Some(reply)
}
