# Common loops. Everything runs inside .venv, created on first use from pyproject.toml.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
export DAGSTER_HOME ?= $(CURDIR)/data/dagster_home
# the demo: the DAYS UTC days ending yesterday (the last day that can be materialized), so the
# UI's partitions and its "last 90 days" range show them; computed once (`make demo START=...`
# picks other days). The generated numbers do not depend on the dates, only the timestamps do.
DAYS ?= 7
ifeq ($(origin START), undefined)
START := $(shell $(PYTHON) -c "import datetime as d;print(d.datetime.now(d.timezone.utc).date()-d.timedelta(days=$(DAYS)))")
endif
END ?= $(shell $(PYTHON) -c "import datetime as d;print(d.date.fromisoformat('$(START)')+d.timedelta(days=$(DAYS)-1))")
# the months the demo's days touch: each gets its showback file (`gpu-pipeline showback`)
MONTHS ?= $(shell $(PYTHON) -c "import datetime as d;s,e=(d.date.fromisoformat(x) for x in ('$(START)','$(END)'));print(*sorted({(s+d.timedelta(days=i)).strftime('%Y-%m') for i in range((e-s).days+1)}))")

NATIVE := gpu_pipeline/native/libgpu_pipeline_native.so
NATIVE_CFLAGS ?= -O2 -Wall -Wextra -shared -fPIC -pthread

.PHONY: demo test dev lint format bench bench-day bench-pull clean install install-dev servers

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(STAMP)

# The exposition tokenizer (gpu_pipeline/native): plain C, loaded with ctypes. Without a C
# compiler the parse takes its Polars path (the same results, slower) and this says so.
$(NATIVE): gpu_pipeline/native/exposition.c
	$(CC) $(NATIVE_CFLAGS) -o $@ $< \
		|| echo "warning: no native exposition tokenizer (C compiler failed); parsing takes the Polars path"

$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(DEV_STAMP)

install: $(STAMP) $(NATIVE)
install-dev: $(DEV_STAMP) $(NATIVE)

demo: $(STAMP) $(NATIVE)
	$(BIN)/gpu-pipeline generate --start $(START) --days $(DAYS)
	$(BIN)/gpu-pipeline materialize --start $(START) --end $(END) --summary
	for m in $(MONTHS); do $(BIN)/gpu-pipeline showback --month $$m || exit 1; done

# Real servers the tests start on loopback (VictoriaMetrics, Prometheus 2.x with promtool,
# PostgreSQL 15 for the Dagster instance: its binaries are off PATH, in /usr/lib/postgresql), and
# the browser that renders the report (Debian packages); a test that needs one fails with
# the reason when it is still missing, it never skips. The tests run their own server on a free
# port with their own data; the system service Debian's prometheus package starts (0.0.0.0:9090)
# and the postgresql cluster service are stopped and disabled when this installs them.
SERVER_PACKAGES := victoria-metrics prometheus chromium postgresql
servers:
	@missing=""; for b in $(SERVER_PACKAGES); do \
		case $$b in postgresql) test -x /usr/lib/postgresql/15/bin/postgres;; *) command -v $$b >/dev/null;; esac \
			|| missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing (Debian packages) for the tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
			|| echo "warning: could not install$$missing; the tests that need it will fail"; \
		case " $$missing " in *" prometheus "*) \
			systemctl disable --now prometheus >/dev/null 2>&1 || true;; esac; \
		case " $$missing " in *" postgresql "*) \
			systemctl disable --now postgresql >/dev/null 2>&1 || true;; esac; \
	fi

# three workers on 2 cores: much of the suite waits on servers it starts (dagster dev, the S3
# and Prometheus-compatible servers, PostgreSQL, Chromium); 13:30 against 16-17 min on two
test: $(DEV_STAMP) $(NATIVE) servers
	$(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder

# `dg dev` (dagster-dg-cli) loads the project from pyproject.toml's [tool.dg]; `dagster dev -w
# workspace.yaml` loads the same definitions
dev: $(STAMP) $(NATIVE)
	$(BIN)/gpu-pipeline init-instance
	VIRTUAL_ENV=$(CURDIR)/.venv $(BIN)/dg dev

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(DEV_STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(DEV_STAMP) $(NATIVE)
	$(BIN)/python benchmarks/run.py

bench-day: $(DEV_STAMP) $(NATIVE)
	$(BIN)/python benchmarks/day.py

bench-pull: $(DEV_STAMP) $(NATIVE) servers
	$(BIN)/python benchmarks/pull.py

clean:
	rm -rf data/raw data/lake data/warehouse.duckdb data/reports
