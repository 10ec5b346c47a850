// src/schema.ts is what openapi-typescript generates from docs/openapi.json now.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { test } from "node:test";

const root = resolve(import.meta.dirname, "../..");

test("the committed types are generated from the committed OpenAPI document", () => {
  const out = join(mkdtempSync(join(tmpdir(), "fencelog-schema-")), "schema.ts");
  execFileSync(join(root, "node_modules/.bin/openapi-typescript"), [join(root, "../../docs/openapi.json"), "-o", out], {
    stdio: "ignore",
  });
  assert.equal(readFileSync(join(root, "src/schema.ts"), "utf8"), readFileSync(out, "utf8"), "run `npm run generate`");
});

test("redocly lint (recommended) passes with no error and no warning", () => {
  const out = execFileSync(
    join(root, "node_modules/.bin/redocly"),
    ["lint", "--extends=recommended", "--format=json", join(root, "../../docs/openapi.json")],
    { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, REDOCLY_TELEMETRY: "off", REDOCLY_SUPPRESS_UPDATE_NOTICE: "true" } },
  );
  const report = JSON.parse(out) as { totals: { errors: number; warnings: number }; problems: unknown[] };
  assert.equal(report.totals.errors, 0, JSON.stringify(report.problems));
  assert.equal(report.totals.warnings, 0, JSON.stringify(report.problems));
});
