// Validate Prometheus Operator objects (JSON documents, one per line on stdin) against the operator's schemas,
// as published by @kubernetes-models/prometheus-operator. Prints one line per object; exit 1 if any is invalid.
import { createInterface } from "node:readline";
import { PrometheusRule, ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const kinds = { PrometheusRule, ServiceMonitor };
let failed = 0;
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const doc = JSON.parse(line);
  const Model = kinds[doc.kind];
  const name = `${doc.kind}/${doc.metadata?.name}`;
  if (doc.apiVersion !== "monitoring.coreos.com/v1" || !Model) {
    console.log(`${name}: not a monitoring.coreos.com/v1 ServiceMonitor or PrometheusRule`);
    failed++;
    continue;
  }
  try {
    new Model(doc).validate();
    console.log(`${name}: valid`);
  } catch (err) {
    console.log(`${name}: INVALID: ${err.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
