//! `-o`'s suboptions: the list split the way getsubopt(3) splits it, and each suboption
//! applied to the configuration being built: kvcached's own, memcached's that are
//! implemented, and memcached's that are accepted and noted as ignored once their values
//! pass memcached's checks.

use std::time::Duration;

use super::values::{bad, cpu_list, ext_path, float, int, int_in};
use super::{Builder, DEFAULT_SQPOLL_IDLE_MS};
use crate::setup::config::IoChoice;

impl Builder {
    /// `-o a,b=c,...`, split the way getsubopt(3) splits it.
    pub(super) fn suboptions(&mut self, list: &str) -> Result<(), String> {
        let mut items: Vec<&str> = list.split(',').collect();
        // getsubopt stops at the end of the string, so one trailing comma is harmless;
        // an empty item anywhere else is an error.
        if items.len() > 1 && items.last() == Some(&"") {
            items.pop();
        }
        if list.is_empty() {
            items.clear();
        }
        for item in items {
            let (key, val) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            self.suboption(item, key, val)?;
        }
        Ok(())
    }

    fn suboption(&mut self, item: &str, key: &str, val: Option<&str>) -> Result<(), String> {
        let sp = format!("-o {key}");
        let sp = sp.as_str();
        let need = |v: Option<&'_ str>| -> Result<String, String> {
            v.map(str::to_string)
                .ok_or_else(|| format!("-o {key} needs a value ({key}=...)"))
        };
        match key {
            // Implemented.
            "metrics" => {
                let v = need(val)?;
                let addr = std::net::ToSocketAddrs::to_socket_addrs(v.as_str())
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or_else(|| format!("-o metrics: {v:?} is not HOST:PORT"))?;
                self.cfg.metrics = Some(addr);
            }
            "idle_timeout" => {
                let secs: u64 = int(sp, &need(val)?, "a number of seconds (0 turns it off)")?;
                self.cfg.idle_timeout = (secs > 0).then(|| Duration::from_secs(secs));
            }
            "reuseport" => self.cfg.reuseport = true,
            "cpu_affinity" => self.cfg.cpu_affinity = true,
            "io" => {
                self.cfg.io = IoChoice::parse(&need(val)?)
                    .ok_or_else(|| "-o io: expected uring, epoll or auto".to_string())?;
            }
            "io_sqpoll" => {
                let ms = match val {
                    Some(v) => int_in(sp, v, 1, 60_000, "milliseconds, 1 to 60000")?,
                    None => DEFAULT_SQPOLL_IDLE_MS,
                };
                self.cfg.io_sqpoll = Some(ms);
            }
            "io_sqpoll_cpus" => {
                self.cfg.io_sqpoll_cpus = cpu_list(sp, &need(val)?)?;
                self.cfg.io_sqpoll.get_or_insert(DEFAULT_SQPOLL_IDLE_MS);
            }
            "maxconns_fast" => self.cfg.maxconns_fast = true,
            "no_maxconns_fast" => self.cfg.maxconns_fast = false,
            "debug_clock" => self.cfg.debug_clock = true,
            // One engine is left; `engine=log` stays accepted so old command lines work.
            "engine" => match need(val)?.as_str() {
                "log" => {}
                "hashmap" => {
                    return Err("-o engine=hashmap: that engine was retired; \
                         the log engine is the only one (drop the option)"
                        .to_string())
                }
                other => return Err(format!("-o engine: unknown engine {other:?} (log)")),
            },

            // Accepted and ignored, values checked as memcached checks them.
            "hashpower" => {
                // Only the level `stats` reports starts there: kvcached's index sizes itself.
                self.cfg.hashpower =
                    int_in::<u32>(sp, &need(val)?, 12, 32, "a number from 12 to 32")?;
                self.ignored(sp);
            }
            "tail_repair_time" => {
                int_in::<u32>(
                    sp,
                    &need(val)?,
                    10,
                    u32::MAX,
                    "a number of seconds, 10 or more",
                )?;
                self.ignored(sp);
            }
            "hash_algorithm" => {
                let v = need(val)?;
                if !matches!(v.as_str(), "jenkins" | "murmur3" | "xxh3") {
                    return Err(bad(sp, &v, "jenkins, murmur3 or xxh3"));
                }
                self.ignored(sp);
            }
            "slab_automove" => {
                if let Some(v) = val {
                    int_in::<u32>(sp, v, 0, 2, "0, 1 or 2")?;
                }
                self.ignored(sp);
            }
            "slab_automove_ratio" => {
                let v = need(val)?;
                let r = float(sp, &v, "a ratio greater than 0, at most 1")?;
                if r <= 0.0 || r > 1.0 {
                    return Err(bad(sp, &v, "a ratio greater than 0, at most 1"));
                }
                self.ignored(sp);
            }
            "slab_automove_window" => {
                int_in::<u32>(sp, &need(val)?, 3, 1800, "a number from 3 to 1800")?;
                self.ignored(sp);
            }
            "slab_automove_freeratio" => {
                float(sp, &need(val)?, "a number")?;
                self.ignored(sp);
            }
            "ext_max_frag" => {
                let f = float(sp, &need(val)?, "a number")?;
                self.ext_max_frag = kvproto::admin::thousandths(f);
            }
            "lru_crawler_sleep" => {
                int_in::<u32>(
                    sp,
                    &need(val)?,
                    0,
                    1_000_000,
                    "microseconds from 0 to 1000000",
                )?;
                self.ignored(sp);
            }
            "read_buf_mem_limit" => {
                let mb = int::<u32>(sp, &need(val)?, "a whole number of megabytes")?;
                self.cfg.read_buf_mem_limit = (mb as usize).saturating_mul(1 << 20);
            }
            "watcher_logbuf_size" => {
                let kb: u32 = int(sp, &need(val)?, "a whole number")?;
                self.cfg.watcher_buf = (kb as usize).saturating_mul(1024);
            }
            "lru_crawler_tocrawl" | "worker_logbuf_size" => {
                int::<u32>(sp, &need(val)?, "a whole number")?;
                self.ignored(sp);
            }
            "warm_restart_ignore_bad_file" => self.cfg.warm_ignore_bad_file = true,
            "log_format" => {
                self.cfg.log_format = match need(val)?.as_str() {
                    "text" => crate::setup::logging::Format::Text,
                    "json" => crate::setup::logging::Format::Json,
                    other => return Err(format!("-o log_format: {other:?} is not text or json")),
                }
            }
            "evict_size_factor" => {
                self.cfg.evict_size_factor =
                    int_in::<u32>(sp, &need(val)?, 0, 64, "a whole number from 0 to 64")?;
            }
            "lru_crawler" => self.cfg.lru_crawler = true,
            "no_lru_crawler" => self.cfg.lru_crawler = false,
            "lru_maintainer" => {
                self.cfg.lru_maintainer = true;
                self.ignored(sp);
            }
            "no_lru_maintainer" => {
                self.cfg.lru_maintainer = false;
                self.ignored(sp);
            }
            "hot_lru_pct" | "warm_lru_pct" => {
                let pct = int_in::<u32>(sp, &need(val)?, 1, 79, "a percentage from 1 to 79")?;
                if key == "hot_lru_pct" {
                    self.hot_lru_pct = pct;
                } else {
                    self.warm_lru_pct = pct;
                }
                self.ignored(sp);
            }
            "hot_max_factor" | "warm_max_factor" => {
                let v = need(val)?;
                if float(sp, &v, "a number greater than 0")? <= 0.0 {
                    return Err(bad(sp, &v, "a number greater than 0"));
                }
                self.ignored(sp);
            }
            "temporary_ttl" => {
                int::<u32>(sp, &need(val)?, "a number of seconds")?;
                self.temporary_ttl = true;
                self.ignored(sp);
            }
            "slab_sizes" => {
                self.slab_sizes = Some(need(val)?);
                self.classes_only(sp);
            }
            "slab_chunk_max" => {
                // memcached 1.6.18 reads bytes; newer releases read kilobytes (at most
                // 1024). Take both: up to 1024 is kilobytes, more is bytes.
                let n: usize = int_in(
                    sp,
                    &need(val)?,
                    1,
                    1 << 30,
                    "a size in kilobytes (1 to 1024) or in bytes",
                )?;
                self.slab_chunk_max = Some(if n <= 1024 { n << 10 } else { n });
                self.classes_only(sp);
            }
            "no_modern" => {
                // As memcached: no slab mover, no LRU maintainer, no LRU crawler (a later
                // `-o lru_crawler` turns the crawler back on), and connections over -c
                // wait in the backlog (no_maxconns_fast).
                self.cfg.maxconns_fast = false;
                self.cfg.lru_maintainer = false;
                self.cfg.slab_reassign = false;
                self.cfg.lru_crawler = false;
            }
            "slab_reassign" | "no_slab_reassign" => {
                self.cfg.slab_reassign = key == "slab_reassign";
                self.ignored(sp);
            }
            "no_hashexpand"
            | "no_slab_automove"
            | "inline_ascii_resp"
            | "no_inline_ascii_resp"
            | "modern"
            | "no_chunked_items"
            | "drop_privileges"
            | "no_drop_privileges"
            | "relaxed_privileges"
            | "sock_cookie_id"
            | "proxy_arg"
            | "proxy_uring"
            | "proxy_memprofile" => self.ignored(sp),
            "track_sizes" => self.cfg.track_sizes = true,
            "resp_obj_mem_limit" => self.note(format!(
                "ignoring memcached option {sp}: deprecated in memcached, no meaning in kvcached"
            )),

            // TLS settings (they take effect with -Z).
            "ssl_chain_cert" => self.cfg.ssl.settings.chain_cert = Some(need(val)?.into()),
            "ssl_key" => self.cfg.ssl.settings.key = Some(need(val)?.into()),
            "ssl_ca_cert" => self.cfg.ssl.settings.ca_cert = Some(need(val)?.into()),
            "ssl_ciphers" => {
                let list = need(val)?;
                kvtls::server::check_ciphers(&list).map_err(|e| e.to_string())?;
                self.cfg.ssl.settings.ciphers = Some(list);
            }
            "ssl_verify_mode" => {
                let n = int_in::<u32>(sp, &need(val)?, 0, 3, "0, 1, 2 or 3")?;
                self.cfg.ssl.settings.verify_mode =
                    kvtls::server::VerifyMode::from_number(n).unwrap_or_default();
            }
            "ssl_min_version" => {
                let n = int_in::<u32>(sp, &need(val)?, 0, 3, "0, 1, 2 or 3")?;
                self.cfg.ssl.settings.min_version = match n {
                    3 => kvtls::server::MinVersion::Tls13,
                    2 => kvtls::server::MinVersion::Tls12,
                    _ => {
                        return Err(format!(
                            "{sp}={n}: kvcached speaks TLS 1.2 and 1.3 only (2 or 3); TLS 1.0 \
                             and 1.1 are obsolete (RFC 8996)"
                        ))
                    }
                };
            }
            "ssl_keyformat" => {
                self.cfg.ssl.settings.key_format = match int::<u32>(sp, &need(val)?, "1 or 2")? {
                    1 => kvtls::server::KeyFormat::Pem,
                    2 => kvtls::server::KeyFormat::Der,
                    _ => {
                        return Err(format!(
                            "{sp}: kvcached reads PEM (1) or DER (2) keys; OpenSSL engines \
                             (3) are not supported"
                        ))
                    }
                };
            }
            "ssl_wbuf_size" => {
                let kib = int_in::<u32>(sp, &need(val)?, 1, 1 << 20, "a size in KiB, 1 or more")?;
                self.cfg.ssl.wbuf_size = kib as usize * 1024;
            }
            "ssl_session_cache" => self.cfg.ssl.settings.session_cache = true,
            "ssl_kernel_tls" => {
                // What memcached says when its OpenSSL cannot offload to the kernel.
                return Err(format!(
                    "{sp}: Kernel TLS offload is not available (kvcached's TLS is rustls, \
                     in user space)"
                ));
            }
            "ssl_handshake_timeout" => {
                let secs: u64 = int(sp, &need(val)?, "a number of seconds (0: never)")?;
                self.cfg.ssl.handshake_timeout = (secs > 0).then(|| Duration::from_secs(secs));
            }

            "proxy_config" => {
                return Err(format!(
                    "{sp}: kvcached has no proxy mode (it is a cache server only)"
                ))
            }

            // extstore: kvcached's flash tier (docs/CONFIGURATION.md).
            "ext_path" => {
                let file = ext_path(&need(val)?)?;
                if self.ext_files.iter().any(|(p, _)| *p == file.0) {
                    return Err(format!("{sp}: {} given twice", file.0.display()));
                }
                self.ext_files.push(file);
            }
            "ext_wbuf_size" => {
                let mb: u64 = int::<u32>(sp, &need(val)?, "a number of megabytes")?.into();
                self.ext_wbuf_size = mb << 20;
            }
            "ext_threads" => {
                self.ext_threads = int_in::<usize>(sp, &need(val)?, 1, 64, "a number of threads")?;
            }
            "ext_ignore_bad_file" => self.ext_ignore_bad_file = true,
            "ext_direct" => self.ext_direct = true,
            "ext_page_size" => {
                int::<u32>(sp, &need(val)?, "a whole number")?;
                self.note(format!(
                    "{sp}: kvcached's flash pages are one segment each; ignored"
                ));
            }
            "ext_recache_rate" => {
                self.ext_recache_rate = int::<u32>(sp, &need(val)?, "a whole number")?;
            }
            "ext_item_size" => {
                self.ext_item_size = int::<u32>(sp, &need(val)?, "a whole number")?;
            }
            "ext_compact_under" => {
                self.ext_compact_under = int::<u32>(sp, &need(val)?, "a whole number")?;
            }
            "ext_drop_unread" => self.ext_drop_unread = true,
            "ext_io_depth" | "ext_item_age" | "ext_low_ttl" | "ext_drop_under"
            | "ext_max_sleep" => {
                int::<u32>(sp, &need(val)?, "a whole number")?;
                self.ext_ignored(sp);
            }

            _ => {
                return Err(format!(
                    "unknown -o suboption \"{item}\" (kvcached -h lists them)"
                ))
            }
        }
        Ok(())
    }

    fn ext_ignored(&mut self, sp: &str) {
        self.note(format!(
            "{sp}: kvcached's flash tier has no such setting yet (docs/CONFIGURATION.md); \
             ignored"
        ));
    }
}
