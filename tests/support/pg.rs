//! A PostgreSQL cluster of a test's (or a bench's) own: Debian's server,
//! initdb and pg_ctl as the postgres user in a temporary directory, on a
//! free loopback port; stopped when dropped. Needs root.

// Each user (the root tests, the HA bench) needs a different part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A PostgreSQL cluster of the test's own, on a free loopback port, with a
/// `runwarden` role (password, scram) owning a `runwarden` database.
pub struct Pg {
    dir: tempfile::TempDir,
    port: u16,
    bin: PathBuf,
}

pub const PG_PASSWORD: &str = "fleet-secret-pw";

fn pg_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL from Debian's packages (postgresql)")
        .map(|d| d.unwrap().path().join("bin"))
        .filter(|b| b.join("pg_ctl").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("a PostgreSQL server under /usr/lib/postgresql")
}

impl Pg {
    pub fn start() -> Pg {
        let dir = tempfile::Builder::new().prefix("rw-pg-").tempdir().unwrap();
        sh(
            "/bin/chown",
            &["postgres:postgres", &dir.path().display().to_string()],
        );
        let pg = Pg {
            port: free_port(),
            bin: pg_bin(),
            dir,
        };
        pg.as_postgres(
            "initdb",
            &[
                "-D",
                &pg.data(),
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
            ],
        );
        pg.start_again();
        pg.psql(
            "postgres",
            &format!("CREATE ROLE runwarden LOGIN PASSWORD '{PG_PASSWORD}'"),
        );
        pg.psql("postgres", "CREATE DATABASE runwarden OWNER runwarden");
        pg
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn as_postgres(&self, program: &str, args: &[&str]) -> String {
        let bin = self.bin.join(program).display().to_string();
        let mut all = vec!["-u", "postgres", "--", &bin];
        all.extend_from_slice(args);
        sh("/usr/sbin/runuser", &all)
    }

    /// Start (again) after [`Pg::stop`]: the same data, the same port.
    pub fn start_again(&self) {
        self.start_listening("127.0.0.1");
    }

    /// Start on `addresses` (`*`: every interface, those made later too).
    pub fn start_listening(&self, addresses: &str) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses={addresses} -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("log").display().to_string();
        self.as_postgres(
            "pg_ctl",
            &["-D", &self.data(), "-o", &opts, "-l", &log, "-w", "start"],
        );
    }

    /// Let clients of `network` (CIDR) in with a password, and listen on
    /// every interface: a restart.
    pub fn allow_network(&self, network: &str) {
        let hba = self.dir.path().join("data/pg_hba.conf");
        let mut text = std::fs::read_to_string(&hba).unwrap();
        text += &format!("host all all {network} scram-sha-256\n");
        std::fs::write(&hba, text).unwrap();
        self.stop();
        self.start_listening("'*'");
    }

    /// Serve TLS only (over TCP) with a certificate for 127.0.0.1 from a
    /// certificate authority of its own, whose certificate (PEM) it returns:
    /// a restart.
    pub fn require_tls(&self) -> PathBuf {
        let dir = self.dir.path().join("tls");
        std::fs::create_dir_all(&dir).unwrap();
        let d = |f: &str| dir.join(f).display().to_string();
        let ssl = |args: &[&str]| sh("/usr/bin/openssl", args);
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        ssl(&[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                &d("ca.key"),
                "-out",
                &d("ca.pem"),
                "-days",
                "2",
                "-subj",
                "/CN=runwarden test CA",
            ],
        ]
        .concat());
        ssl(&[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                &d("server.key"),
                "-out",
                &d("server.csr"),
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat());
        std::fs::write(dir.join("san"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        ssl(&[
            "x509",
            "-req",
            "-in",
            &d("server.csr"),
            "-CA",
            &d("ca.pem"),
            "-CAkey",
            &d("ca.key"),
            "-CAcreateserial",
            "-out",
            &d("server.crt"),
            "-days",
            "2",
            "-extfile",
            &d("san"),
        ]);
        sh(
            "/bin/chown",
            &["-R", "postgres:postgres", &dir.display().to_string()],
        );
        sh("/bin/chmod", &["600", &d("server.key")]);
        let conf = self.dir.path().join("data/postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap();
        text += &format!(
            "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
            d("server.crt"),
            d("server.key")
        );
        std::fs::write(&conf, text).unwrap();
        // TCP only with TLS: `host` lines become `hostssl`.
        let hba = self.dir.path().join("data/pg_hba.conf");
        let text = std::fs::read_to_string(&hba).unwrap();
        let text: String = text
            .lines()
            .map(|l| match l.strip_prefix("host ") {
                Some(rest) => format!("hostssl {rest}\n"),
                None => format!("{l}\n"),
            })
            .collect();
        std::fs::write(&hba, text).unwrap();
        self.stop();
        self.start_again();
        dir.join("ca.pem")
    }

    /// Stop it, as an outage would: connections are cut.
    pub fn stop(&self) {
        self.as_postgres(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }

    /// The URL through `host` (an address it listens on).
    pub fn url_via(&self, host: &str) -> String {
        self.url().replace("@127.0.0.1:", &format!("@{host}:"))
    }

    pub fn url(&self) -> String {
        format!(
            "postgresql://runwarden:{PG_PASSWORD}@127.0.0.1:{}/runwarden",
            self.port
        )
    }

    /// One SQL command as the superuser, over the socket: its rows, `|`-separated.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let sock = self.dir.path().display().to_string();
        let port = self.port.to_string();
        let psql = "/usr/bin/psql";
        let out = Command::new("/usr/sbin/runuser")
            .args([
                "-u", "postgres", "--", psql, "-h", &sock, "-p", &port, "-d", db,
            ])
            .args(["-AtXq", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn sql(&self, sql: &str) -> String {
        self.psql("runwarden", sql)
    }

    /// The rows case `i` of the admission table
    /// (`tests/fixtures/admission-cases.json`) starts from, for runbook
    /// `table-{i}` on host `h`: a run in flight or one that ended, and
    /// earlier starts. Returns the runbook.
    pub fn seed_admission_case(&self, i: usize, case: &serde_json::Value) -> String {
        let runbook = format!("table-{i}");
        let before = &case["before"];
        if before["in_flight"] == true {
            self.sql(&format!(
                "INSERT INTO runwarden_leases (runbook, host, token, run_id, replica, expires_at, keys)
                 VALUES ('{runbook}', 'h', 1, 'before-{i}', 'other', now() + interval '1 hour', {})",
                text_array(&before["keys"])
            ));
        } else if let Some(ago) = before["ended_s_ago"].as_u64() {
            self.sql(&format!(
                "INSERT INTO runwarden_leases (runbook, host, token, ended_at, keys)
                 VALUES ('{runbook}', 'h', 1, now() - interval '{ago} seconds', {})",
                text_array(&before["keys"])
            ));
        }
        for (k, ago) in before["starts_s_ago"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            self.sql(&format!(
                "INSERT INTO runwarden_runs (run_id, runbook, host, replica, token, status, started_at)
                 VALUES ('start-{i}-{k}', '{runbook}', 'h', 'other', 1, 'ended', now() - interval '{ago} seconds')"
            ));
        }
        runbook
    }
}

/// A JSON list of strings as an SQL `text[]` literal (test values only:
/// nothing is escaped).
pub fn text_array(v: &serde_json::Value) -> String {
    let items: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|k| format!("'{}'", k.as_str().unwrap()))
        .collect();
    format!("ARRAY[{}]::text[]", items.join(", "))
}

impl Drop for Pg {
    fn drop(&mut self) {
        let _ = Command::new("/usr/sbin/runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args(["-D", &self.data(), "-m", "immediate", "stop"])
            .output();
    }
}
