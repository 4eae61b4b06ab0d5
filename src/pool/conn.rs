//! Newline-delimited JSON over the pool's Unix socket, and connecting to a daemon that may not
//! be there yet.

use std::io;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use super::paths::PoolPaths;

/// The longest line accepted: a fan-out answer can be large, but not unbounded.
const MAX_LINE: usize = 512 * 1024 * 1024;

pub struct LineReader {
    inner: BufReader<OwnedReadHalf>,
    buf: String,
}

pub struct LineWriter {
    inner: OwnedWriteHalf,
}

pub fn split(stream: UnixStream) -> (LineReader, LineWriter) {
    let (read, write) = stream.into_split();
    (
        LineReader {
            inner: BufReader::new(read),
            buf: String::new(),
        },
        LineWriter { inner: write },
    )
}

impl LineReader {
    /// The next message, or `None` at end of stream.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> io::Result<Option<T>> {
        loop {
            self.buf.clear();
            let n = self.inner.read_line(&mut self.buf).await?;
            if n == 0 {
                return Ok(None);
            }
            if self.buf.len() > MAX_LINE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "message too long",
                ));
            }
            if self.buf.trim().is_empty() {
                continue;
            }
            return serde_json::from_str(self.buf.trim_end())
                .map(Some)
                .map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("bad message: {e}"))
                });
        }
    }
}

impl LineWriter {
    pub async fn send<T: Serialize>(&mut self, message: &T) -> io::Result<()> {
        let mut line = serde_json::to_vec(message)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        line.push(b'\n');
        self.inner.write_all(&line).await?;
        self.inner.flush().await
    }
}

pub async fn connect(paths: &PoolPaths) -> io::Result<(LineReader, LineWriter)> {
    Ok(split(UnixStream::connect(paths.socket()).await?))
}

/// Why no daemon answered.
#[derive(Debug)]
pub enum Unreachable {
    /// The pool was stopped with `drover-pool stop`.
    Stopped,
    TimedOut,
}

/// Connects, waiting for the daemon as long as `limit` allows (forever when `None`). Says once
/// on stderr what it waits for. Gives up at once when the pool was stopped on purpose and
/// `stop_on_marker` is set.
pub async fn connect_waiting(
    paths: &PoolPaths,
    limit: Option<Duration>,
    stop_on_marker: bool,
    who: &str,
) -> Result<(LineReader, LineWriter), Unreachable> {
    let started = tokio::time::Instant::now();
    let mut announced = false;
    loop {
        match connect(paths).await {
            Ok(conn) => {
                if announced {
                    crate::say!("{who}: connected to pool `{}`", paths.name);
                }
                return Ok(conn);
            }
            Err(e) => {
                if stop_on_marker && marker_present(&paths.stopped_marker()) {
                    return Err(Unreachable::Stopped);
                }
                if limit.is_some_and(|limit| started.elapsed() >= limit) {
                    return Err(Unreachable::TimedOut);
                }
                if !announced {
                    crate::say!(
                        "{who}: waiting for the pool daemon of pool `{}` at {} ({e}); start it with `drover-pool start`",
                        paths.name,
                        paths.socket().display()
                    );
                    announced = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn marker_present(path: &Path) -> bool {
    path.exists()
}
