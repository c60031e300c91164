CREATE TABLE alembic_version (
    version_num VARCHAR(32) NOT NULL, 
    CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)
);

-- Running upgrade  -> 0001_generation_1

CREATE TABLE relay_runs (
    id TEXT NOT NULL, 
    repo TEXT NOT NULL, 
    workflow TEXT NOT NULL, 
    ticket_id TEXT NOT NULL, 
    ticket_key TEXT NOT NULL, 
    state TEXT NOT NULL, 
    current_node TEXT, 
    current_node_visit_id TEXT, 
    last_error TEXT, 
    started_at DATETIME NOT NULL, 
    updated_at DATETIME NOT NULL, 
    finished_at DATETIME, 
    CONSTRAINT pk_relay_runs PRIMARY KEY (id)
);

CREATE INDEX relay_runs_ticket_key ON relay_runs (ticket_key);

CREATE INDEX relay_runs_workflow_state ON relay_runs (workflow, state);

CREATE INDEX relay_runs_repo_state ON relay_runs (repo, state);

INSERT INTO alembic_version (version_num) VALUES ('0001_generation_1') RETURNING version_num;

-- Running upgrade 0001_generation_1 -> 0002_generation_2

ALTER TABLE relay_runs ADD COLUMN retry_error TEXT;

ALTER TABLE relay_runs ADD COLUMN retry_attempt INTEGER;

ALTER TABLE relay_runs ADD COLUMN next_retry_at DATETIME;

CREATE TABLE relay_node_runtime (
    run_id TEXT NOT NULL, 
    node TEXT NOT NULL, 
    terminal_id TEXT, 
    session_id TEXT, 
    node_visit_id TEXT NOT NULL, 
    updated_at DATETIME NOT NULL, 
    CONSTRAINT pk_relay_node_runtime PRIMARY KEY (run_id, node), 
    CONSTRAINT fk_relay_node_runtime_run_id_relay_runs FOREIGN KEY(run_id) REFERENCES relay_runs (id) ON DELETE CASCADE
);

CREATE TABLE relay_processed_reports (
    run_id TEXT NOT NULL, 
    report_id TEXT NOT NULL, 
    node_visit_id TEXT NOT NULL, 
    created_at DATETIME NOT NULL, 
    CONSTRAINT pk_relay_processed_reports PRIMARY KEY (run_id, report_id), 
    CONSTRAINT fk_relay_processed_reports_run_id_relay_runs FOREIGN KEY(run_id) REFERENCES relay_runs (id) ON DELETE CASCADE
);

CREATE TABLE relay_node_sessions (
    run_id TEXT NOT NULL, 
    node TEXT NOT NULL, 
    session_id TEXT NOT NULL, 
    node_visit_id TEXT NOT NULL, 
    created_at DATETIME NOT NULL, 
    CONSTRAINT pk_relay_node_sessions PRIMARY KEY (run_id, node, session_id), 
    CONSTRAINT fk_relay_node_sessions_run_id_relay_runs FOREIGN KEY(run_id) REFERENCES relay_runs (id) ON DELETE CASCADE
);

UPDATE alembic_version SET version_num='0002_generation_2' WHERE alembic_version.version_num = '0001_generation_1';

-- Running upgrade 0002_generation_2 -> 0003_generation_3

ALTER TABLE relay_runs ADD COLUMN logical_run_id TEXT;

ALTER TABLE relay_runs ADD COLUMN attempt_id INTEGER;

CREATE TABLE relay_executor_identity (
    singleton INTEGER NOT NULL, 
    executor_plugin TEXT NOT NULL, 
    temporal_address TEXT, 
    temporal_namespace TEXT, 
    CONSTRAINT pk_relay_executor_identity PRIMARY KEY (singleton), 
    CONSTRAINT ck_relay_executor_identity_ck_relay_executor_identity_singleton CHECK (singleton = 1)
);

UPDATE alembic_version SET version_num='0003_generation_3' WHERE alembic_version.version_num = '0002_generation_2';

-- Running upgrade 0003_generation_3 -> 0004_adopt_legacy_rows

UPDATE relay_runs SET logical_run_id=CASE WHEN (coalesce(relay_runs.logical_run_id, '') = '') THEN relay_runs.id ELSE relay_runs.logical_run_id END, attempt_id=CASE WHEN (relay_runs.attempt_id IS NULL OR relay_runs.attempt_id = 0) THEN 1 ELSE relay_runs.attempt_id END, current_node=nullif(relay_runs.current_node, ''), current_node_visit_id=nullif(relay_runs.current_node_visit_id, ''), last_error=nullif(relay_runs.last_error, '');

UPDATE relay_node_runtime SET terminal_id=nullif(relay_node_runtime.terminal_id, ''), session_id=nullif(relay_node_runtime.session_id, '');

UPDATE alembic_version SET version_num='0004_adopt_legacy_rows' WHERE alembic_version.version_num = '0003_generation_3';

-- Running upgrade 0004_adopt_legacy_rows -> 0005_scale_indexes

CREATE INDEX relay_runs_list_order ON relay_runs (started_at, id);

CREATE INDEX relay_runs_logical_attempts ON relay_runs (logical_run_id, started_at, attempt_id);

CREATE INDEX relay_runs_active_workflow ON relay_runs (workflow, started_at, id) WHERE state NOT IN ('canceled', 'completed');

CREATE INDEX relay_runs_active_repo ON relay_runs (repo, started_at, id) WHERE state NOT IN ('canceled', 'completed');

CREATE INDEX relay_runs_sweepable ON relay_runs (finished_at) WHERE state IN ('canceled', 'completed');

UPDATE alembic_version SET version_num='0005_scale_indexes' WHERE alembic_version.version_num = '0004_adopt_legacy_rows';

