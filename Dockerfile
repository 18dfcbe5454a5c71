# lull: one binary, one SQLite file in /data.
#
#   docker build -t lull .
#   docker run -d -v lull-data:/data --env-file .env lull
#
# Build stage: dependencies are compiled in a layer of their own, so changing
# lull's code does not rebuild them. Every bench named in Cargo.toml gets a
# stub, or cargo refuses the manifest.
FROM rust:1.95-slim AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY port/Cargo.toml port/
COPY core/Cargo.toml core/
COPY adapters/Cargo.toml adapters/
RUN mkdir -p src benches port/src core/src \
    && echo 'fn main() {}' > src/main.rs \
    && touch port/src/lib.rs core/src/lib.rs adapters/lib.rs \
    && for bench in $(sed -n '/^\[\[bench\]\]/{n;s/^name = "\(.*\)"$/\1/p;}' Cargo.toml); do \
         echo 'fn main() {}' > "benches/$bench.rs"; done \
    && cargo build --release --locked --bin lull \
    && rm -rf src benches port/src core/src adapters/lib.rs
COPY src ./src
COPY port/src ./port/src
COPY core/src ./core/src
COPY adapters ./adapters
COPY benches ./benches
RUN touch src/main.rs port/src/lib.rs core/src/lib.rs adapters/lib.rs \
    && cargo build --release --locked --bin lull

# Runtime: Debian slim with CA certificates (for TLS to Telegram, Discord and the
# model server), a non-root user, the database on a volume.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin lull \
    && mkdir -p /data \
    && chown lull:lull /data
COPY --from=build /src/target/release/lull /usr/local/bin/lull
USER 10001:10001
WORKDIR /data
ENV DATABASE_URL=sqlite:/data/lull.db \
    LULL_HTTP_ADDR=0.0.0.0:8080
VOLUME ["/data"]
EXPOSE 8080
# `lull healthcheck` calls /healthz, so the image needs no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 CMD ["lull", "healthcheck"]
# Exec form: lull is PID 1 and receives SIGTERM itself (it finishes replies in
# flight within LULL_SHUTDOWN_GRACE_MS, then releases its leases).
ENTRYPOINT ["lull"]
CMD ["run"]
