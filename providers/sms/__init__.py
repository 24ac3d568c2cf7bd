"""SMS providers: Twilio (`providers.sms.twilio`) and Zenvia (`providers.sms.zenvia`)."""
