//! A money transfer whose business writes and idempotency outcome commit
//! together, the same code on SQLite, PostgreSQL and MariaDB: each store's
//! `execute_in_tx` runs the transfer in a transaction that also records its
//! outcome, and `begin` / `complete_in` hand back a guard whose rollback
//! gives the key back.
//!
//! ```text
//! cargo run -p example-transfer                                  # sqlite: a file in the temporary directory
//! cargo run -p example-transfer -- sqlite:bank.db
//! cargo run -p example-transfer -- postgres://root@127.0.0.1:5432/test
//! cargo run -p example-transfer -- mysql://root@127.0.0.1:3306/test
//! ```
//!
//! It moves 30 from one new account to another, retries the transfer (a
//! replay: nothing moves twice), then makes an attempt that records its
//! outcome and rolls back (the key comes back, so the retry runs at once),
//! checking the balances after each step; it exits non-zero if one is off.
//! Only the statements differ between stores: rusqlite's closures for
//! SQLite, sqlx for the servers.

use std::time::{SystemTime, UNIX_EPOCH};

use idem::mysql::sqlx::MySqlConnection;
use idem::mysql::MySqlStore;
use idem::postgres::sqlx::{self, PgConnection};
use idem::postgres::PostgresStore;
use idem::sqlite::{SqliteStore, SqliteTx};
use idem::{BeginJson, Error, Idempotent};
use serde::{Deserialize, Serialize};

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// What the client asks for; its fingerprint guards the key.
#[derive(Debug, Clone, Serialize)]
struct Transfer {
    from: String,
    to: String,
    amount: i64,
}

/// The recorded outcome, replayed to every retry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    from_balance: i64,
    to_balance: i64,
}

/// The store, chosen by URL. Every arm below is the same code over its
/// store's types.
enum Bank {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
    MySql(MySqlStore),
}

const ACCOUNTS: &str = "CREATE TABLE IF NOT EXISTS transfer_accounts \
    (id VARCHAR(64) PRIMARY KEY, balance BIGINT NOT NULL)";
const LOG: &str = "CREATE TABLE IF NOT EXISTS transfer_log \
    (id VARCHAR(255) PRIMARY KEY, from_id VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)";

impl Bank {
    async fn open(url: &str) -> Result<Bank, Failure> {
        if let Some(path) = url.strip_prefix("sqlite:") {
            let store = SqliteStore::open(path).await?;
            let mut tx = store.begin().await?;
            tx.call(|conn| conn.execute_batch(&format!("{ACCOUNTS}; {LOG}")))
                .await?;
            tx.commit().await?;
            Ok(Bank::Sqlite(store))
        } else if url.starts_with("postgres") {
            let store = PostgresStore::connect(url).await?;
            store.migrate().await?;
            for table in [ACCOUNTS, LOG] {
                sqlx::query(table).execute(store.pool()).await?;
            }
            Ok(Bank::Postgres(store))
        } else if url.starts_with("mysql") || url.starts_with("mariadb") {
            let store = MySqlStore::connect(url).await?;
            store.migrate().await?;
            for table in [ACCOUNTS, LOG] {
                sqlx::query(table).execute(store.pool()).await?;
            }
            Ok(Bank::MySql(store))
        } else {
            Err(format!("{url:?}: expected sqlite:PATH, postgres://… or mysql://…").into())
        }
    }

    fn idempotent(&self) -> Idempotent {
        match self {
            Bank::Sqlite(store) => Idempotent::new(store.clone()),
            Bank::Postgres(store) => Idempotent::new(store.clone()),
            Bank::MySql(store) => Idempotent::new(store.clone()),
        }
    }

    /// Moves the money once for `key`: the transfer's writes and its
    /// receipt commit together; a retry gets the receipt back.
    async fn transfer(
        &self,
        idem: &Idempotent,
        key: &str,
        transfer: &Transfer,
    ) -> Result<Receipt, Error<String>> {
        let (t, id) = (transfer.clone(), key.to_owned());
        match self {
            Bank::Sqlite(store) => {
                store
                    .execute_in_tx(idem, key, transfer, |tx| {
                        Box::pin(async move { sqlite_move(tx, &id, &t).await })
                    })
                    .await
            }
            Bank::Postgres(store) => {
                store
                    .execute_in_tx(idem, key, transfer, |tx| {
                        Box::pin(async move { pg_move(tx, &id, &t).await })
                    })
                    .await
            }
            Bank::MySql(store) => {
                store
                    .execute_in_tx(idem, key, transfer, |tx| {
                        Box::pin(async move { mysql_move(tx, &id, &t).await })
                    })
                    .await
            }
        }
    }

    /// The low-level form: claim, move the money in a transaction of our
    /// own, record the receipt in it with `complete_in`, then roll back (as
    /// a later step failing would). The guard gives the key back.
    async fn attempt_and_roll_back(
        &self,
        idem: &Idempotent,
        key: &str,
        transfer: &Transfer,
    ) -> Result<(), Failure> {
        let BeginJson::Run(lease) = idem.begin_json::<_, Receipt, String>(key, transfer).await?
        else {
            return Err(format!("{key} was already settled").into());
        };
        match self {
            Bank::Sqlite(store) => {
                let mut tx = store.begin().await?;
                let receipt = sqlite_move(&mut tx, key, transfer).await?;
                let payload = serde_json::to_vec(&receipt)?;
                let done = store.complete_in(&mut tx, lease, &payload).await?;
                done.rollback(tx.rollback()).await?;
            }
            Bank::Postgres(store) => {
                let mut tx = store.begin().await?;
                let receipt = pg_move(&mut tx, key, transfer).await?;
                let payload = serde_json::to_vec(&receipt)?;
                let done = store.complete_in(&mut tx, lease, &payload).await?;
                done.rollback(tx.rollback()).await?;
            }
            Bank::MySql(store) => {
                let mut tx = store.begin().await?;
                let receipt = mysql_move(&mut tx, key, transfer).await?;
                let payload = serde_json::to_vec(&receipt)?;
                let done = store.complete_in(&mut tx, lease, &payload).await?;
                done.rollback(tx.rollback()).await?;
            }
        }
        Ok(())
    }

    /// Opens an account with `balance`.
    async fn open_account(&self, id: &str, balance: i64) -> Result<(), Failure> {
        let id = id.to_owned();
        match self {
            Bank::Sqlite(store) => {
                let mut tx = store.begin().await?;
                tx.call(move |conn| {
                    conn.execute(
                        "INSERT INTO transfer_accounts VALUES (?1, ?2)",
                        (id, balance),
                    )
                })
                .await?;
                tx.commit().await?;
            }
            Bank::Postgres(store) => {
                sqlx::query("INSERT INTO transfer_accounts VALUES ($1, $2)")
                    .bind(id)
                    .bind(balance)
                    .execute(store.pool())
                    .await?;
            }
            Bank::MySql(store) => {
                sqlx::query("INSERT INTO transfer_accounts VALUES (?, ?)")
                    .bind(id)
                    .bind(balance)
                    .execute(store.pool())
                    .await?;
            }
        }
        Ok(())
    }

    /// An account's balance and the number of transfers logged from it.
    async fn account(&self, id: &str) -> Result<(i64, i64), Failure> {
        let id = id.to_owned();
        let balance = "SELECT balance, (SELECT COUNT(*) FROM transfer_log WHERE from_id = a.id) \
                       FROM transfer_accounts a WHERE id = ";
        Ok(match self {
            Bank::Sqlite(store) => {
                let mut tx = store.begin().await?;
                let read = tx
                    .call(move |conn| {
                        conn.query_row(&format!("{balance}?1"), [id], |row| {
                            Ok((row.get(0)?, row.get(1)?))
                        })
                    })
                    .await;
                tx.rollback().await?;
                read?
            }
            Bank::Postgres(store) => {
                sqlx::query_as(&format!("{balance}$1"))
                    .bind(id)
                    .fetch_one(store.pool())
                    .await?
            }
            Bank::MySql(store) => {
                sqlx::query_as(&format!("{balance}?"))
                    .bind(id)
                    .fetch_one(store.pool())
                    .await?
            }
        })
    }
}

/// The transfer's statements on SQLite: closures on the transaction's
/// connection.
async fn sqlite_move(tx: &mut SqliteTx, key: &str, t: &Transfer) -> Result<Receipt, String> {
    let (key, t) = (key.to_owned(), t.clone());
    tx.call(move |conn| {
        let debited = conn.execute(
            "UPDATE transfer_accounts SET balance = balance - ?1 WHERE id = ?2 AND balance >= ?1",
            (t.amount, &t.from),
        )?;
        if debited != 1 {
            return Ok(Err(format!("{} cannot pay {}", t.from, t.amount)));
        }
        conn.execute(
            "UPDATE transfer_accounts SET balance = balance + ?1 WHERE id = ?2",
            (t.amount, &t.to),
        )?;
        conn.execute(
            "INSERT INTO transfer_log VALUES (?1, ?2, ?3)",
            (&key, &t.from, t.amount),
        )?;
        let balance = |id: &str| {
            conn.query_row(
                "SELECT balance FROM transfer_accounts WHERE id = ?1",
                [id],
                |row| row.get(0),
            )
        };
        Ok(Ok(Receipt {
            from_balance: balance(&t.from)?,
            to_balance: balance(&t.to)?,
        }))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// The transfer's statements on PostgreSQL.
async fn pg_move(tx: &mut PgConnection, key: &str, t: &Transfer) -> Result<Receipt, String> {
    let sql = |e: sqlx::Error| e.to_string();
    let debited = sqlx::query(
        "UPDATE transfer_accounts SET balance = balance - $1 WHERE id = $2 AND balance >= $1",
    )
    .bind(t.amount)
    .bind(&t.from)
    .execute(&mut *tx)
    .await
    .map_err(sql)?;
    if debited.rows_affected() != 1 {
        return Err(format!("{} cannot pay {}", t.from, t.amount));
    }
    sqlx::query("UPDATE transfer_accounts SET balance = balance + $1 WHERE id = $2")
        .bind(t.amount)
        .bind(&t.to)
        .execute(&mut *tx)
        .await
        .map_err(sql)?;
    sqlx::query("INSERT INTO transfer_log VALUES ($1, $2, $3)")
        .bind(key)
        .bind(&t.from)
        .bind(t.amount)
        .execute(&mut *tx)
        .await
        .map_err(sql)?;
    let mut balances = [0; 2];
    for (balance, id) in balances.iter_mut().zip([&t.from, &t.to]) {
        *balance = sqlx::query_scalar("SELECT balance FROM transfer_accounts WHERE id = $1")
            .bind(id)
            .fetch_one(&mut *tx)
            .await
            .map_err(sql)?;
    }
    Ok(Receipt {
        from_balance: balances[0],
        to_balance: balances[1],
    })
}

/// The transfer's statements on MariaDB: PostgreSQL's, with `?` for the
/// placeholders.
async fn mysql_move(tx: &mut MySqlConnection, key: &str, t: &Transfer) -> Result<Receipt, String> {
    let sql = |e: sqlx::Error| e.to_string();
    let debited = sqlx::query(
        "UPDATE transfer_accounts SET balance = balance - ? WHERE id = ? AND balance >= ?",
    )
    .bind(t.amount)
    .bind(&t.from)
    .bind(t.amount)
    .execute(&mut *tx)
    .await
    .map_err(sql)?;
    if debited.rows_affected() != 1 {
        return Err(format!("{} cannot pay {}", t.from, t.amount));
    }
    sqlx::query("UPDATE transfer_accounts SET balance = balance + ? WHERE id = ?")
        .bind(t.amount)
        .bind(&t.to)
        .execute(&mut *tx)
        .await
        .map_err(sql)?;
    sqlx::query("INSERT INTO transfer_log VALUES (?, ?, ?)")
        .bind(key)
        .bind(&t.from)
        .bind(t.amount)
        .execute(&mut *tx)
        .await
        .map_err(sql)?;
    let mut balances = [0; 2];
    for (balance, id) in balances.iter_mut().zip([&t.from, &t.to]) {
        *balance = sqlx::query_scalar("SELECT balance FROM transfer_accounts WHERE id = ?")
            .bind(id)
            .fetch_one(&mut *tx)
            .await
            .map_err(sql)?;
    }
    Ok(Receipt {
        from_balance: balances[0],
        to_balance: balances[1],
    })
}

fn check(what: &str, ok: bool) -> Result<(), Failure> {
    if ok {
        println!("ok: {what}");
        Ok(())
    } else {
        Err(format!("FAILED: {what}").into())
    }
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let url = std::env::args().nth(1).unwrap_or_else(|| {
        let path = std::env::temp_dir().join("idem-example-transfer.db");
        format!("sqlite:{}", path.display())
    });
    let bank = Bank::open(&url).await?;
    let idem = bank.idempotent();
    // New accounts and keys on every run, so runs against one database
    // never meet.
    let run =
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() ^ u128::from(std::process::id());
    let (alice, bob) = (format!("alice-{run:x}"), format!("bob-{run:x}"));
    bank.open_account(&alice, 100).await?;
    bank.open_account(&bob, 0).await?;
    let transfer = Transfer {
        from: alice.clone(),
        to: bob.clone(),
        amount: 30,
    };

    let key = format!("transfer-{run:x}-1");
    let first = bank.transfer(&idem, &key, &transfer).await?;
    println!("{key}: {first:?}");
    let retry = bank.transfer(&idem, &key, &transfer).await?;
    check("a retry replays the receipt", retry == first)?;
    check(
        "a retry moves nothing twice",
        bank.account(&alice).await? == (70, 1) && bank.account(&bob).await?.0 == 30,
    )?;

    let key = format!("transfer-{run:x}-2");
    bank.attempt_and_roll_back(&idem, &key, &transfer).await?;
    check(
        "a rolled-back attempt leaves no trace",
        bank.account(&alice).await? == (70, 1),
    )?;
    // Had the key stayed claimed, this would be `InProgress` for a minute.
    let second = bank.transfer(&idem, &key, &transfer).await?;
    check(
        "a rolled-back attempt gives the key back: the retry runs at once",
        second.from_balance == 40 && bank.account(&alice).await? == (40, 2),
    )?;
    println!("done on {}", url.split(':').next().unwrap_or("?"));
    Ok(())
}
