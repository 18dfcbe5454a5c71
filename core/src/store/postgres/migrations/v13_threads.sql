
CREATE TABLE threads (
    platform  TEXT   NOT NULL,
    key       TEXT   NOT NULL,
    opened_at BIGINT NOT NULL,
    PRIMARY KEY (platform, key)
);
