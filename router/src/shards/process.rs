//! The shard processes behind the sockets, as the kernel sees them.
//!
//! A shard is one Python process: a native call that holds its GIL (a grammar compile) keeps
//! it from answering any RPC while it works, and a stopped one (SIGSTOP) answers nothing
//! either. Their gRPC silence looks the same; /proc tells them apart: a stopped process is in
//! state `T`, a busy one keeps adding CPU time. The shards run on this host (unix sockets),
//! and the socket's peer credentials name each one's pid.
use std::time::Duration;

/// What /proc says about a process at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// State `T` (stopped by a signal) or `t` (stopped by a tracer).
    pub stopped: bool,
    /// User plus system time of all its threads, in clock ticks.
    pub cpu_ticks: u64,
}

/// The pid of the process listening on the unix socket at `path`, if the kernel says.
pub async fn listener_pid(path: &str) -> Option<u32> {
    let connect = tokio::net::UnixStream::connect(path);
    let stream = tokio::time::timeout(Duration::from_secs(2), connect)
        .await
        .ok()?
        .ok()?;
    let pid = stream.peer_cred().ok()?.pid()?;
    u32::try_from(pid).ok()
}

/// Reads `/proc/{pid}/stat`; None where it cannot be read (gone, or not Linux).
pub fn sample(pid: u32) -> Option<Sample> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat(text: &str) -> Option<Sample> {
    // The command name (field 2) may hold spaces and parentheses: fields follow the last ')'.
    let rest = text.get(text.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = *fields.first()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Sample {
        stopped: state == "T" || state == "t",
        cpu_ticks: utime + stime,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_state_and_cpu_time_past_an_awkward_name() {
        let line = "4242 (tg (shard) x) T 1 2 3 4 5 6 7 8 9 10 110 25 0 0 20 0 9 0";
        assert_eq!(
            parse_stat(line),
            Some(Sample {
                stopped: true,
                cpu_ticks: 135
            })
        );
        let running = "7 (python) R 1 2 3 4 5 6 7 8 9 10 3 4 0 0";
        assert_eq!(parse_stat(running).map(|s| s.stopped), Some(false));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn sees_a_stopped_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert_eq!(sample(pid).map(|s| s.stopped), Some(false));
        unsafe { libc_kill(pid as i32, 19) }; // SIGSTOP
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !sample(pid).is_some_and(|s| s.stopped) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(sample(pid).map(|s| s.stopped), Some(true));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(sample(pid), None);
    }

    extern "C" {
        #[link_name = "kill"]
        fn libc_kill(pid: i32, sig: i32) -> i32;
    }
}
