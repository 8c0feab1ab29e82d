//! SIGHUP and `dcpictl reload`: re-read the configuration, apply what changes live.

use crate::config::Settings;
use crate::status::ReloadReport;

use super::shared::{lock, unix_ms_now, Shared};
use super::start::jit_limits;
use crate::config::RELOADABLE;
use crate::sys::sock;

impl Shared {
    /// Re-read the configuration and apply what can change live. Never stops the daemon.
    pub(super) fn reload(&self, trigger: &str) -> ReloadReport {
        let mut rep = ReloadReport {
            unix_ms: unix_ms_now(),
            trigger: trigger.to_string(),
            ..ReloadReport::default()
        };
        let new = match &self.hooks.reload {
            Some(f) => f().map_err(|e| e.to_string()),
            None => Err("this dcpid has no configuration to reload".to_string()),
        };
        match new.and_then(|n| self.apply_reload(n)) {
            Ok((applied, restart)) => {
                rep.ok = true;
                if !restart.is_empty() {
                    tracing::warn!(keys = %restart.join(", "), "reload: these settings need a restart of dcpid; keeping their running values");
                }
                tracing::info!(trigger, applied = %applied.join("; "), "configuration reloaded");
                rep.applied = applied;
                rep.restart_required = restart;
            }
            Err(e) => {
                tracing::error!(trigger, error = %e, "reload rejected; keeping the running configuration");
                rep.error = Some(e);
            }
        }
        lock(&self.status_only).last_reload = Some(rep.clone());
        rep
    }

    pub(super) fn apply_reload(&self, new: Settings) -> Result<(Vec<String>, Vec<String>), String> {
        let old = self.settings();
        let changed = old.changed(&new);
        let (live, restart): (Vec<&str>, Vec<&str>) =
            changed.iter().partition(|k| RELOADABLE.contains(k));
        let mut restart: Vec<String> = restart.into_iter().map(str::to_owned).collect();
        // What can fail comes first, so that a rejected reload changes nothing.
        let group = if live.contains(&"socket_group") {
            let gid = match &new.socket_group {
                Some(name) => match sock::group_id(name) {
                    Some(g) => Some(g),
                    None if new.socket_group_explicit => {
                        return Err(format!("socket_group: no group named {name:?}"))
                    }
                    None => None,
                },
                None => None,
            };
            Some(gid)
        } else {
            None
        };
        let mut applied = Vec::new();
        let mut taken = Vec::new();
        for &key in &live {
            match key {
                "log_level" => match &self.hooks.set_log_level {
                    Some(f) => f(&new.log_level).map_err(|e| format!("log_level: {e}"))?,
                    None => {
                        restart.push(key.into());
                        continue;
                    }
                },
                "perf_map_max_bytes" | "perf_map_max_entries" => {
                    self.aggregator.with_resolver(|r| r.set_jit_limits(jit_limits(&new)));
                }
                "socket_group" => {
                    if let Some(gid) = group {
                        self.access.set_group(&old.socket, gid).map_err(|e| e.to_string())?;
                    }
                }
                // The others are read from the settings where they are used.
                _ => {}
            }
            applied.push(format!("{key}: {} -> {}", old.show(key), new.show(key)));
            taken.push(key);
        }
        {
            let mut s = self.settings.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            for key in taken {
                s.take(key, &new);
            }
            s.socket_group_explicit = new.socket_group_explicit;
            s.config_file = new.config_file.clone();
        }
        // A publish in progress holds the store; the next tick applies the change then.
        if let Ok(mut store) = self.store.try_lock() {
            self.sync_store(&mut store);
        }
        if let Some(t) = lock(&self.flusher).as_ref() {
            t.unpark();
        }
        Ok((applied, restart))
    }
}
