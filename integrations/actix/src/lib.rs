//! actix-web integration for tower-lock (filled in by the integrations issue).
