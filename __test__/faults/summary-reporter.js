'use strict'

// Records the run's test outcome for the global teardown, which prints and writes the summary
// (jest calls onRunComplete before the global teardown).
const fs = require('node:fs')
const path = require('node:path')

const { PARTS_DIR } = require('./paths')

class FaultSummaryReporter {
  onRunComplete(_contexts, results) {
    const failed = []
    for (const file of results.testResults) {
      if (file.testExecError) failed.push(`${path.basename(file.testFilePath)}: ${file.testExecError.message}`)
      for (const t of file.testResults) {
        if (t.status === 'failed') failed.push(`${path.basename(file.testFilePath)}: ${t.fullName}`)
      }
    }
    fs.mkdirSync(PARTS_DIR, { recursive: true })
    fs.writeFileSync(
      path.join(PARTS_DIR, 'jest.json'),
      JSON.stringify({
        numTotalTests: results.numTotalTests,
        numPassedTests: results.numPassedTests,
        numFailedTests: results.numFailedTests,
        numPendingTests: results.numPendingTests,
        numFailedTestSuites: results.numFailedTestSuites,
        failed,
      }),
    )
  }
}

module.exports = FaultSummaryReporter
