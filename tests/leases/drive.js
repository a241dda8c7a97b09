// Drives the Node client for tests/suite/lease_clients.rs: checks each
// policy at the rates a schedule gives, as an application would, and
// prints what it saw as JSON lines, so that a driver killed midway has
// told what it saw up to then: every tenth of a second (stamped with the
// time, ms since the Unix epoch), for each policy, how many checks were
// issued since, when each check allowed since was answered, and how many
// were denied or failed; at the end, the client's lease counters.
//
// Usage: node drive.js <settings JSON>, with address, key, schedule (a list
// of {seconds, rates: {policy: checks per second}}), deadlineMs (each
// call's), and leases (false to turn them off).

'use strict';

const path = require('node:path');
const { RateLimitClient } = require(path.join(__dirname, '..', '..', 'clients', 'node'));

const TICK_MS = 5;
const REPORT_MS = 100;

function emptySeen(policies) {
  return Object.fromEntries(
    policies.map((policy) => [policy, { issued: 0, allowed: [], denied: 0, failed: 0, errors: [] }]),
  );
}

async function main() {
  const settings = JSON.parse(process.argv[2]);
  // A loaded test machine may answer a call slowly: a check that fails for
  // its deadline would count as failed, which is not what is measured.
  const options = { address: settings.address, deadlineMs: settings.deadlineMs ?? 300 };
  if (settings.leases === false) options.leases = false;
  const client = new RateLimitClient(options);
  const policies = [...new Set(settings.schedule.flatMap((phase) => Object.keys(phase.rates)))];
  let seen = emptySeen(policies);
  const report = () => {
    process.stdout.write(`${JSON.stringify({ at: Date.now(), seen, counters: client.leaseStats() })}\n`);
    seen = emptySeen(policies);
  };
  let lastReport = Date.now();
  let phaseStart = Date.now();
  for (const phase of settings.schedule) {
    const issued = Object.fromEntries(Object.keys(phase.rates).map((policy) => [policy, 0]));
    const phaseEnd = phaseStart + phase.seconds * 1000;
    while (Date.now() < phaseEnd) {
      const elapsed = (Date.now() - phaseStart) / 1000;
      const checks = [];
      for (const [policy, rate] of Object.entries(phase.rates)) {
        const due = Math.floor(rate * elapsed) - issued[policy];
        for (let i = 0; i < due; i += 1) {
          issued[policy] += 1;
          seen[policy].issued += 1;
          checks.push(
            client.check(settings.key, { policy }).then(
              (answer) => {
                if (answer.allowed) seen[policy].allowed.push(Date.now());
                else seen[policy].denied += 1;
              },
              (err) => {
                seen[policy].failed += 1;
                if (seen[policy].errors.length < 3) seen[policy].errors.push(String(err));
              },
            ),
          );
        }
      }
      await Promise.all(checks);
      if (Date.now() - lastReport >= REPORT_MS) {
        report();
        lastReport = Date.now();
      }
      await new Promise((resolve) => setTimeout(resolve, TICK_MS));
    }
    phaseStart = phaseEnd;
  }
  report();
  const stats = client.leaseStats();
  await client.close();
  process.stdout.write(`${JSON.stringify({ stats })}\n`);
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
